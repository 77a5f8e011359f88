"""A CTranslate2 Whisper model directory turned into an openai-whisper checkpoint.

The openai-whisper engine loads a checkpoint file, ``{"dims": {...}, "model_state_dict":
{...}}``; the only model on a machine with no network is the bundled CTranslate2 tiny.en.
Both hold the same weights under other names, so this module reads CTranslate2's
``model.bin`` (no ctranslate2 import), dequantizes, renames and splits.

``model.bin`` (binary version 6, little-endian): u32 version, string spec name, u32
revision, u32 count, then per variable: string name, u8 rank, u32 × rank shape, u8 dtype
(0 float32, 1 int8, 2 int16, 3 int32, 4 float16, 5 bfloat16), u32 byte count, the bytes;
then u32 count of aliases, each a pair of strings (alias, target). A string is u16 length
(NUL included), the bytes and the NUL. Quantized weights come with ``<name>_scale``:
int8 per output row (w = q / scale[row]), int16 one scalar (w = q / scale).

Names (``E`` = ``encoder/layer_{i}``, ``D`` = ``decoder/layer_{i}``; CTranslate2's
``gamma``/``beta`` are the layer norms' ``weight``/``bias``):

========================================  =================================================
CTranslate2                               openai-whisper
========================================  =================================================
encoder/conv1/{weight,bias}               encoder.conv1.{weight,bias}
encoder/conv2/{weight,bias}               encoder.conv2.{weight,bias}
encoder/position_encodings/encodings      encoder.positional_embedding (sinusoids, a buffer)
E/self_attention/layer_norm               encoder.blocks.{i}.attn_ln
E/self_attention/linear_0 (q|k|v fused)   encoder.blocks.{i}.attn.{query,key,value}
                                          (split in 3 rows-wise; ``key`` has no bias: its
                                          third of the fused bias is zeros and is dropped)
E/self_attention/linear_1                 encoder.blocks.{i}.attn.out
E/ffn/layer_norm                          encoder.blocks.{i}.mlp_ln
E/ffn/linear_0, E/ffn/linear_1            encoder.blocks.{i}.mlp.0, encoder.blocks.{i}.mlp.2
encoder/layer_norm                        encoder.ln_post
decoder/embeddings/weight                 decoder.token_embedding.weight (the output
                                          projection, alias decoder/projection/weight, is
                                          tied to it in both)
decoder/position_encodings/encodings      decoder.positional_embedding (learned)
D/self_attention/layer_norm               decoder.blocks.{i}.attn_ln
D/self_attention/linear_0 (q|k|v fused)   decoder.blocks.{i}.attn.{query,key,value}
D/self_attention/linear_1                 decoder.blocks.{i}.attn.out
D/attention/layer_norm                    decoder.blocks.{i}.cross_attn_ln
D/attention/linear_0                      decoder.blocks.{i}.cross_attn.query
D/attention/linear_1 (k|v fused)          decoder.blocks.{i}.cross_attn.{key,value}
D/attention/linear_2                      decoder.blocks.{i}.cross_attn.out
D/ffn/layer_norm, D/ffn/linear_{0,1}      decoder.blocks.{i}.mlp_ln, .mlp.0, .mlp.2
decoder/layer_norm                        decoder.ln
========================================  =================================================

Scalars (``*/num_heads``, flags) are not weights: the head counts go into ``dims``, the
rest is fixed for Whisper. ``dims``: n_mels = conv1 input channels, n_audio_ctx and
n_text_ctx = the position tables' lengths, n_*_state = their widths, n_*_layer = the
layers counted, n_*_head = ``num_heads`` (else ``config.json``), n_vocab = the embedding
rows. The cross-attention heads that align words (``config.json``'s ``alignment_heads``)
are kept in the checkpoint as ``alignment_heads``: openai-whisper ignores the key, this
service's engine applies it.
"""

from __future__ import annotations

import json
import os
import pickle
import re
import struct
import tempfile
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

DTYPES = ("float32", "int8", "int16", "int32", "float16", "bfloat16")
BINARY_VERSION = 6


class ConversionError(ValueError):
    """The source is not a CTranslate2 Whisper model this converter can read; says why."""


def read_model_bin(path: str | os.PathLike[str]) -> tuple[dict[str, np.ndarray], dict[str, str], dict[str, Any]]:
    """Variables (raw dtypes, bfloat16 as uint16), aliases, and a header {version, spec, revision}."""
    data = Path(path).read_bytes()
    pos = 0

    def take(fmt: str) -> Any:
        nonlocal pos
        values = struct.unpack_from("<" + fmt, data, pos)
        pos += struct.calcsize("<" + fmt)
        return values[0] if len(values) == 1 else values

    def string() -> str:
        nonlocal pos
        size = take("H")
        text = data[pos : pos + size - 1].decode("utf-8")
        pos += size
        return text

    version = take("I")
    if version != BINARY_VERSION:
        raise ConversionError(
            f"{path}: CTranslate2 binary version {version}; this converter reads version "
            f"{BINARY_VERSION} (CTranslate2 3.x and 4.x): convert the model again with a current "
            "ct2-transformers-converter"
        )
    spec, revision = string(), take("I")
    variables: dict[str, np.ndarray] = {}
    for _ in range(take("I")):
        name = string()
        rank = take("B")
        shape = tuple(take("I") for _ in range(rank))
        dtype, size = DTYPES[take("B")], take("I")
        stored = np.uint16 if dtype == "bfloat16" else np.dtype(dtype)  # numpy has no bfloat16
        variables[name] = np.frombuffer(
            data, dtype=stored, count=size // np.dtype(stored).itemsize, offset=pos
        ).reshape(shape)
        pos += size
    aliases = {}
    for _ in range(take("I")):
        alias = string()
        aliases[alias] = string()
    return variables, aliases, {"version": version, "spec": spec, "revision": revision}


def weight_dtype(model_dir: str | os.PathLike[str]) -> str:
    """The stored type of the model's weight matrices (what `ct2-*-converter --quantization` chose)."""
    variables, _aliases, _header = read_model_bin(Path(model_dir) / "model.bin")
    return _dtype_name(variables["encoder/conv1/weight"])


def _dtype_name(array: np.ndarray) -> str:
    return "bfloat16" if array.dtype == np.uint16 else str(array.dtype)


def dequantize(variables: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Every weight as float32: scales applied and dropped, half and bfloat16 widened."""
    out = {}
    for name, value in variables.items():
        if name.endswith("_scale"):
            continue
        scale = variables.get(name + "_scale")
        if value.dtype == np.uint16:  # bfloat16: the high half of a float32
            value = (value.astype(np.uint32) << 16).view(np.float32)
        if scale is not None:
            value = value.astype(np.float32)
            if value.ndim >= 2 and np.ndim(scale) == 1:  # int8: one scale per output row
                value = value / scale.astype(np.float32).reshape((-1,) + (1,) * (value.ndim - 1))
            else:  # int16: one scale
                value = value / np.float32(scale)
        elif value.dtype.kind == "f":
            value = value.astype(np.float32)
        out[name] = value
    return out


def _config(model_dir: Path) -> dict[str, Any]:
    path = model_dir / "config.json"
    return json.loads(path.read_text()) if path.exists() else {}


def _count_layers(variables: dict[str, np.ndarray], side: str) -> int:
    found = {int(m.group(1)) for n in variables if (m := re.match(rf"{side}/layer_(\d+)/", n))}
    if found != set(range(len(found))) or not found:
        raise ConversionError(f"the {side}'s layers are not numbered 0..n-1: {sorted(found)}")
    return len(found)


def _heads(variables: dict[str, np.ndarray], config: dict[str, Any], side: str, state: int) -> int:
    if f"{side}/num_heads" in variables:
        return int(variables[f"{side}/num_heads"])
    if "num_heads" in config:
        return int(config["num_heads"])
    return state // 64  # every Whisper size has 64-wide heads


def _pairs(
    prefix: str, ct2: str, variables: dict[str, np.ndarray], out: dict[str, np.ndarray], bias: bool = True
) -> None:
    out[f"{prefix}.weight"] = variables[f"{ct2}/weight"]
    if bias:
        out[f"{prefix}.bias"] = variables[f"{ct2}/bias"]


def _norm(prefix: str, ct2: str, variables: dict[str, np.ndarray], out: dict[str, np.ndarray]) -> None:
    out[f"{prefix}.weight"] = variables[f"{ct2}/gamma"]
    out[f"{prefix}.bias"] = variables[f"{ct2}/beta"]


def _split(
    prefix: str, names: tuple[str, ...], ct2: str, variables: dict[str, np.ndarray], out: dict[str, np.ndarray]
) -> None:
    """A fused projection (rows q|k|v, or k|v) into openai-whisper's separate Linear layers."""
    weights = np.split(variables[f"{ct2}/weight"], len(names), axis=0)
    biases = np.split(variables[f"{ct2}/bias"], len(names), axis=0)
    for name, weight, bias in zip(names, weights, biases, strict=True):
        out[f"{prefix}.{name}.weight"] = weight
        if name == "key":
            if np.abs(bias).max(initial=0.0) > 1e-6:
                raise ConversionError(f"{ct2}: the key projection has a bias; openai-whisper's key has none")
        else:
            out[f"{prefix}.{name}.bias"] = bias


def state_dict(model_dir: str | os.PathLike[str]) -> tuple[dict[str, np.ndarray], dict[str, int], list[list[int]]]:
    """openai-whisper's state dict (float32 arrays), its dims, and the alignment heads."""
    model_dir = Path(model_dir)
    if not (model_dir / "model.bin").is_file():
        raise ConversionError(f"{model_dir} has no model.bin: name a CTranslate2 Whisper model directory")
    raw, _aliases, header = read_model_bin(model_dir / "model.bin")
    if header["spec"] != "WhisperSpec":
        raise ConversionError(f"{model_dir} holds a {header['spec']}, not a Whisper model")
    v = dequantize(raw)
    config = _config(model_dir)
    sd: dict[str, np.ndarray] = {}
    for conv in ("conv1", "conv2"):
        _pairs(f"encoder.{conv}", f"encoder/{conv}", v, sd)
    sd["encoder.positional_embedding"] = v["encoder/position_encodings/encodings"]
    n_audio_layer, n_text_layer = _count_layers(v, "encoder"), _count_layers(v, "decoder")
    for i in range(n_audio_layer):
        src, dst = f"encoder/layer_{i}", f"encoder.blocks.{i}"
        _norm(f"{dst}.attn_ln", f"{src}/self_attention/layer_norm", v, sd)
        _split(f"{dst}.attn", ("query", "key", "value"), f"{src}/self_attention/linear_0", v, sd)
        _pairs(f"{dst}.attn.out", f"{src}/self_attention/linear_1", v, sd)
        _norm(f"{dst}.mlp_ln", f"{src}/ffn/layer_norm", v, sd)
        _pairs(f"{dst}.mlp.0", f"{src}/ffn/linear_0", v, sd)
        _pairs(f"{dst}.mlp.2", f"{src}/ffn/linear_1", v, sd)
    _norm("encoder.ln_post", "encoder/layer_norm", v, sd)
    sd["decoder.token_embedding.weight"] = v["decoder/embeddings/weight"]
    sd["decoder.positional_embedding"] = v["decoder/position_encodings/encodings"]
    for i in range(n_text_layer):
        src, dst = f"decoder/layer_{i}", f"decoder.blocks.{i}"
        _norm(f"{dst}.attn_ln", f"{src}/self_attention/layer_norm", v, sd)
        _split(f"{dst}.attn", ("query", "key", "value"), f"{src}/self_attention/linear_0", v, sd)
        _pairs(f"{dst}.attn.out", f"{src}/self_attention/linear_1", v, sd)
        _norm(f"{dst}.cross_attn_ln", f"{src}/attention/layer_norm", v, sd)
        _pairs(f"{dst}.cross_attn.query", f"{src}/attention/linear_0", v, sd)
        _split(f"{dst}.cross_attn", ("key", "value"), f"{src}/attention/linear_1", v, sd)
        _pairs(f"{dst}.cross_attn.out", f"{src}/attention/linear_2", v, sd)
        _norm(f"{dst}.mlp_ln", f"{src}/ffn/layer_norm", v, sd)
        _pairs(f"{dst}.mlp.0", f"{src}/ffn/linear_0", v, sd)
        _pairs(f"{dst}.mlp.2", f"{src}/ffn/linear_1", v, sd)
    _norm("decoder.ln", "decoder/layer_norm", v, sd)
    n_audio_ctx, n_audio_state = sd["encoder.positional_embedding"].shape
    n_text_ctx, n_text_state = sd["decoder.positional_embedding"].shape
    dims = {
        "n_mels": int(sd["encoder.conv1.weight"].shape[1]),
        "n_audio_ctx": int(n_audio_ctx),
        "n_audio_state": int(n_audio_state),
        "n_audio_head": _heads(raw, config, "encoder", n_audio_state),
        "n_audio_layer": n_audio_layer,
        "n_vocab": int(sd["decoder.token_embedding.weight"].shape[0]),
        "n_text_ctx": int(n_text_ctx),
        "n_text_state": int(n_text_state),
        "n_text_head": _heads(raw, config, "decoder", n_text_state),
        "n_text_layer": n_text_layer,
    }
    heads = [[int(layer), int(head)] for layer, head in config.get("alignment_heads") or []]
    return sd, dims, heads


def convert(src_dir: str | os.PathLike[str], dest: str | os.PathLike[str], half: bool | None = None) -> dict[str, int]:
    """Write the checkpoint to `dest` atomically (a temporary file renamed into place); returns dims.

    `half`: store float16 (the size of openai's own checkpoints). The default stores
    float16 when every source weight was float16 already (lossless), else float32.
    """
    import torch

    sd, dims, heads = state_dict(src_dir)
    if half is None:
        half = weight_dtype(src_dir) == "float16"
    dtype = torch.float16 if half else torch.float32
    checkpoint = {
        "dims": dims,
        "model_state_dict": {
            name: torch.from_numpy(np.ascontiguousarray(value)).to(dtype) for name, value in sd.items()
        },
        "alignment_heads": heads,
        "converted_from": {"path": str(Path(src_dir).resolve()), "ctranslate2_dtype": weight_dtype(src_dir)},
    }
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}-", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as out:
            torch.save(checkpoint, out)
        os.chmod(tmp, 0o644)  # mkstemp made it 0600; other users' workers may read the model
        os.replace(tmp, dest)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return dims


class _Skip:
    """Stands for every torch object in a checkpoint's pickle: called with anything, holds nothing."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        pass

    def __call__(self, *args: object, **kwargs: object) -> _Skip:
        return _Skip()

    def __setstate__(self, state: object) -> None:
        pass


class _DimsUnpickler(pickle.Unpickler):
    """Reads a checkpoint's plain data (dims) without torch: tensors become placeholders,
    and no class outside torch and collections.OrderedDict is ever loaded."""

    def find_class(self, module: str, name: str) -> type[object]:
        if module == "collections" and name == "OrderedDict":
            from collections import OrderedDict

            return OrderedDict
        if module == "torch" or module.startswith("torch."):
            return _Skip
        raise pickle.UnpicklingError(f"a checkpoint should hold no {module}.{name}")

    def persistent_load(self, pid: object) -> None:
        return None


def checkpoint_dims(path: str | os.PathLike[str]) -> dict[str, int]:
    """A checkpoint's `dims`, read in the web process without torch or the weights."""
    with zipfile.ZipFile(path) as archive:
        name = next((n for n in archive.namelist() if n.endswith("/data.pkl") or n == "data.pkl"), None)
        if name is None:
            raise ConversionError(f"{path} is not a PyTorch checkpoint (no data.pkl inside)")
        with archive.open(name) as fh:
            checkpoint = _DimsUnpickler(fh).load()
    if not isinstance(checkpoint, dict) or not isinstance(checkpoint.get("dims"), dict):
        raise ConversionError(f"{path} is not an openai-whisper checkpoint (no dims)")
    return {k: int(v) for k, v in checkpoint["dims"].items()}
