"""`whisperq convert-model`: a CTranslate2 Whisper model turned into an openai-whisper
checkpoint (models.speech.convert)."""

from __future__ import annotations

import click


@click.command("convert-model")
@click.argument("src_dir", type=click.Path(exists=True, file_okay=False))
@click.argument("dest", type=click.Path(dir_okay=False))
@click.option(
    "--half/--float32", default=None, help="Store float16 or float32 (default: float16 when the source is float16)."
)
def convert_model(src_dir: str, dest: str, half: bool | None) -> None:
    """Turn a CTranslate2 Whisper model directory into an openai-whisper checkpoint (DEST.pt),
    for WHISPERQ_ENGINE=openai-whisper; needs the openai-whisper extra (PyTorch)."""
    from models.speech.convert import ConversionError, convert, weight_dtype

    try:
        import torch  # noqa: F401
    except ImportError:
        raise click.ClickException(
            "converting needs PyTorch: pip install torch==2.13.0, then pip install -e '.[openai-whisper]'"
        ) from None
    try:
        dims = convert(src_dir, dest, half=half)
        source_dtype = weight_dtype(src_dir)
    except (ConversionError, KeyError) as exc:
        raise click.ClickException(f"cannot convert {src_dir}: {exc}") from exc
    click.echo(f"wrote {dest} from {src_dir} ({source_dtype} weights)")
    click.echo("dims " + ", ".join(f"{k}={v}" for k, v in dims.items()))
