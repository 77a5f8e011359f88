"""The openai-whisper engine: the CTranslate2 converter, and that it transcribes like faster-whisper."""

import itertools
import os

import numpy as np
import pytest
from helpers import CLIPS, need_service, word_error_rate

from models.speech import audio
from models.speech.engines import bundled_model_path, is_multilingual

TINY_EN = {
    "n_mels": 80,
    "n_audio_ctx": 1500,
    "n_audio_state": 384,
    "n_audio_head": 6,
    "n_audio_layer": 4,
    "n_vocab": 51864,
    "n_text_ctx": 448,
    "n_text_state": 384,
    "n_text_head": 6,
    "n_text_layer": 4,
}


@pytest.fixture(scope="module")
def torch():
    try:
        import torch
        import whisper  # noqa: F401
    except ImportError as exc:
        need_service(
            f"the openai-whisper engine needs its extra ({exc}): "
            "pip install torch==2.13.0 && pip install -e '.[openai-whisper]'"
        )
    return torch


@pytest.fixture(scope="module")
def settings(torch, tmp_path_factory):
    """Settings that select the engine, on a data dir of this module's own."""
    from config import Settings

    return Settings.from_env(
        {
            "WHISPERQ_DATA_DIR": str(tmp_path_factory.mktemp("openai-engine")),
            "WHISPERQ_ENGINE": "openai-whisper",
            "WHISPERQ_DEVICE": "cpu",
            "WHISPERQ_INPUT_DIRS": os.environ["WHISPERQ_INPUT_DIRS"],
            # The job below is a message without a key, as the suite's own stacks take them.
            "WHISPERQ_ALLOW_ANONYMOUS": os.environ["WHISPERQ_ALLOW_ANONYMOUS"],
        }
    )


@pytest.fixture(scope="module")
def checkpoint(settings):
    """The default model of the engine: the bundled tiny.en, converted into the data dir."""
    from models.speech.openai_engine import checkpoint_path

    return checkpoint_path(settings, bundled_model_path())


@pytest.fixture(scope="module")
def openai_engine(checkpoint):
    from models.speech.openai_engine import OpenAIWhisperEngine

    return OpenAIWhisperEngine(checkpoint, device="cpu")


def clip(name: str) -> np.ndarray:
    return audio.decode(CLIPS[name]["path"])


@pytest.mark.model
def test_the_bundled_model_converts_once_into_the_data_dir_and_loads_strictly(torch, settings, checkpoint):
    from whisper.model import ModelDimensions, Whisper

    from models.speech.convert import checkpoint_dims, weight_dtype
    from models.speech.openai_engine import checkpoint_path

    assert checkpoint == str(settings.data_dir / "models" / "tiny.en.pt")
    assert weight_dtype(bundled_model_path()) == "float16"
    loaded = torch.load(checkpoint, map_location="cpu", weights_only=True)
    assert loaded["dims"] == TINY_EN
    Whisper(ModelDimensions(**loaded["dims"])).load_state_dict(loaded["model_state_dict"], strict=True)
    assert loaded["alignment_heads"] == [[1, 0], [2, 0], [2, 5], [3, 0], [3, 1], [3, 2], [3, 3], [3, 4]]
    # The web process reads the dims without torch, to refuse languages an English-only model lacks.
    assert checkpoint_dims(checkpoint) == TINY_EN and not is_multilingual(checkpoint)
    mtime = (settings.data_dir / "models" / "tiny.en.pt").stat().st_mtime_ns
    assert checkpoint_path(settings, bundled_model_path()) == checkpoint
    assert (settings.data_dir / "models" / "tiny.en.pt").stat().st_mtime_ns == mtime  # converted once
    assert not [p for p in (settings.data_dir / "models").iterdir() if p.name != "tiny.en.pt"]  # no temp left


@pytest.mark.model
def test_converted_tensors_are_the_ctranslate2_ones(torch, checkpoint):
    from models.speech.convert import read_model_bin

    raw, aliases, header = read_model_bin(f"{bundled_model_path()}/model.bin")
    assert (header["spec"], aliases) == ("WhisperSpec", {"decoder/projection/weight": "decoder/embeddings/weight"})
    sd = torch.load(checkpoint, map_location="cpu", weights_only=True)["model_state_dict"]

    def same(name, value):
        np.testing.assert_allclose(sd[name].float().numpy(), value.astype(np.float32), rtol=0, atol=1e-6, err_msg=name)

    same("encoder.conv1.weight", raw["encoder/conv1/weight"])
    same("encoder.positional_embedding", raw["encoder/position_encodings/encodings"])
    qkv = np.split(raw["encoder/layer_0/self_attention/linear_0/weight"], 3)
    for part, name in zip(qkv, ("query", "key", "value"), strict=True):
        same(f"encoder.blocks.0.attn.{name}.weight", part)
    assert not np.any(np.split(raw["encoder/layer_0/self_attention/linear_0/bias"], 3)[1])  # key: no bias
    same("encoder.blocks.0.attn.value.bias", np.split(raw["encoder/layer_0/self_attention/linear_0/bias"], 3)[2])
    kv = np.split(raw["decoder/layer_3/attention/linear_1/weight"], 2)
    same("decoder.blocks.3.cross_attn.key.weight", kv[0])
    same("decoder.blocks.3.cross_attn.value.weight", kv[1])
    same("decoder.blocks.3.cross_attn.out.bias", raw["decoder/layer_3/attention/linear_2/bias"])
    same("decoder.blocks.2.mlp.2.weight", raw["decoder/layer_2/ffn/linear_1/weight"])
    same("decoder.token_embedding.weight", raw["decoder/embeddings/weight"])
    same("decoder.ln.weight", raw["decoder/layer_norm/gamma"])
    same("encoder.ln_post.bias", raw["encoder/layer_norm/beta"])


@pytest.mark.model
def test_an_int8_model_written_by_ctranslate2_is_dequantized(torch, tmp_path):
    """The bundled model is float16; an int8 one (scales per row) is built here with
    CTranslate2's own writer from a small random Whisper, and must come back within a step."""
    from ctranslate2.specs import whisper_spec
    from whisper.model import ModelDimensions, Whisper

    from models.speech.convert import convert, weight_dtype

    dims = {
        "n_mels": 80,
        "n_audio_ctx": 12,
        "n_audio_state": 64,
        "n_audio_head": 2,
        "n_audio_layer": 2,
        "n_vocab": 300,
        "n_text_ctx": 16,
        "n_text_state": 64,
        "n_text_head": 2,
        "n_text_layer": 2,
    }
    torch.manual_seed(0)
    model = Whisper(ModelDimensions(**dims))
    for p in model.parameters():
        torch.nn.init.normal_(p, std=0.2)
    original = {k: v.detach().numpy().astype(np.float32) for k, v in model.state_dict().items()}
    w = {k: v.copy() for k, v in original.items()}  # CTranslate2 quantizes its inputs in place

    def linear(spec, name, bias=True):
        spec.weight = w[f"{name}.weight"]
        if bias:
            spec.bias = w[f"{name}.bias"]

    def norm(spec, name):
        spec.gamma, spec.beta = w[f"{name}.weight"], w[f"{name}.bias"]

    def fused(spec, name, parts):  # as CTranslate2's converter fuses them: a zero bias for the key
        spec.weight = np.concatenate([w[f"{name}.{p}.weight"] for p in parts])
        spec.bias = np.concatenate([w.get(f"{name}.{p}.bias", np.zeros(64, np.float32)) for p in parts])

    spec = whisper_spec.WhisperSpec(2, 2, 2, 2)
    enc, dec = spec.encoder, spec.decoder
    linear(enc.conv1, "encoder.conv1")
    linear(enc.conv2, "encoder.conv2")
    enc.position_encodings.encodings = w["encoder.positional_embedding"]
    norm(enc.layer_norm, "encoder.ln_post")
    for i, layer in enumerate(enc.layer):
        name = f"encoder.blocks.{i}"
        norm(layer.self_attention.layer_norm, f"{name}.attn_ln")
        fused(layer.self_attention.linear[0], f"{name}.attn", ("query", "key", "value"))
        linear(layer.self_attention.linear[1], f"{name}.attn.out")
        norm(layer.ffn.layer_norm, f"{name}.mlp_ln")
        linear(layer.ffn.linear_0, f"{name}.mlp.0")
        linear(layer.ffn.linear_1, f"{name}.mlp.2")
    dec.embeddings.weight = w["decoder.token_embedding.weight"]
    dec.projection.weight = dec.embeddings.weight
    dec.position_encodings.encodings = w["decoder.positional_embedding"]
    norm(dec.layer_norm, "decoder.ln")
    for i, layer in enumerate(dec.layer):
        name = f"decoder.blocks.{i}"
        norm(layer.self_attention.layer_norm, f"{name}.attn_ln")
        fused(layer.self_attention.linear[0], f"{name}.attn", ("query", "key", "value"))
        linear(layer.self_attention.linear[1], f"{name}.attn.out")
        norm(layer.attention.layer_norm, f"{name}.cross_attn_ln")
        linear(layer.attention.linear[0], f"{name}.cross_attn.query")
        fused(layer.attention.linear[1], f"{name}.cross_attn", ("key", "value"))
        linear(layer.attention.linear[2], f"{name}.cross_attn.out")
        norm(layer.ffn.layer_norm, f"{name}.mlp_ln")
        linear(layer.ffn.linear_0, f"{name}.mlp.0")
        linear(layer.ffn.linear_1, f"{name}.mlp.2")
    spec.register_vocabulary([f"t{i}" for i in range(dims["n_vocab"])])
    spec.validate()
    spec.optimize(quantization="int8")
    (tmp_path / "ct2").mkdir()
    spec.save(str(tmp_path / "ct2"))

    assert weight_dtype(tmp_path / "ct2") == "int8"
    assert convert(tmp_path / "ct2", tmp_path / "small.pt") == dims
    loaded = torch.load(tmp_path / "small.pt", weights_only=True)
    assert all(v.dtype == torch.float32 for v in loaded["model_state_dict"].values())
    Whisper(ModelDimensions(**dims)).load_state_dict(loaded["model_state_dict"], strict=True)
    for name, value in original.items():
        got = loaded["model_state_dict"][name].numpy()
        # int8 rounds each row to 1/127 of its largest magnitude: half of that at most.
        step = np.abs(value).reshape(value.shape[0], -1).max(axis=1) / 127 if value.ndim >= 2 else 1e-6
        err = np.abs(got - value).reshape(value.shape[0], -1).max(axis=1) if value.ndim >= 2 else np.abs(got - value)
        assert np.all(err <= step * 0.5 + 1e-6), name


@pytest.mark.model
@pytest.mark.parametrize("name", ["fox.flac", "report.opus"])
def test_clips_come_out_right_and_as_faster_whisper_reads_them(openai_engine, bundled_engine, name):
    t = openai_engine.transcribe(clip(name), language="en")
    assert word_error_rate(CLIPS[name]["text"], t.text) <= 0.2, t.text
    assert t.language == "en" and t.segments and 0.0 <= t.segments[0].start < 0.5  # the first word, not the window
    theirs = bundled_engine.transcribe(clip(name), language="en")
    assert word_error_rate(theirs.text, t.text) <= 0.05, (theirs.text, t.text)


@pytest.mark.model
def test_a_batch_of_mixed_windows_equals_the_windows_one_by_one(openai_engine):
    fox, report = clip("fox.flac"), clip("report.opus")
    windows, offsets = [report, fox, report[: 16000 * 3]], [0.0, 31.5, 60.0]
    batched = openai_engine.transcribe_batch(windows, offsets, "en")
    alone = [openai_engine.transcribe_batch([w], [o], "en")[0] for w, o in zip(windows, offsets, strict=True)]
    assert batched == alone
    assert batched[1][0].start == 31.5  # times are offset by the window's start


@pytest.mark.model
def test_word_timestamps(openai_engine, bundled_engine):
    ours = openai_engine.transcribe_batch([clip("fox.flac")], [2.0], "en", word_timestamps=True)[0]
    words = [w for s in ours for w in s.words]
    assert " ".join(w["word"] for w in words) == " ".join(s.text for s in ours)
    assert words[0]["start"] >= 2.0 and all(a["end"] <= b["start"] + 1e-6 for a, b in itertools.pairwise(words))
    theirs = [
        w
        for s in bundled_engine.transcribe_batch([clip("fox.flac")], [2.0], "en", word_timestamps=True)[0]
        for w in s.words
    ]
    assert [w["word"].lower() for w in words] == [w["word"].lower() for w in theirs]
    assert max(abs(a["start"] - b["start"]) for a, b in zip(words, theirs, strict=True)) <= 0.2


def test_settings_take_a_checkpoint_file_only_for_this_engine(settings, checkpoint):
    from config import ConfigError, Settings

    env = {"WHISPERQ_DATA_DIR": str(settings.data_dir), "WHISPERQ_MODEL": checkpoint}
    assert Settings.from_env(dict(env, WHISPERQ_ENGINE="openai-whisper")).model_path == checkpoint
    with pytest.raises(ConfigError, match="needs WHISPERQ_ENGINE=openai-whisper"):
        Settings.from_env(env)
    with pytest.raises(ConfigError, match="neither a file nor a CTranslate2 model directory"):
        Settings.from_env(dict(env, WHISPERQ_ENGINE="openai-whisper", WHISPERQ_MODEL=str(settings.data_dir)))


def test_a_worker_with_this_engine_completes_a_job(checkpoint, own_inference):
    """infer_job as the inference pool runs it, with the process's engine chosen by the settings."""
    from models.jobs.record import new_job_id
    from models.pipeline import inference
    from models.pipeline.preparation import prepare_job
    from models.speech.openai_engine import OpenAIWhisperEngine

    rt, batcher = own_inference
    job_id = new_job_id()
    prepared = prepare_job(rt, job_id, str(CLIPS["fox.flac"]["path"]), {"language": "en"})
    result = inference.infer_job(rt, prepared, batcher)
    assert rt.built("engine") == [rt.engine] and isinstance(rt.engine, OpenAIWhisperEngine)
    assert rt.engine.path == checkpoint
    assert word_error_rate(CLIPS["fox.flac"]["text"], result["text"]) <= 0.2, result
