"""The `whisperq` command (the console script ``web.cli:cli``): one module per concept, each
defining its own commands or group, which this module adds to the `cli` group. No module here
imports this one; they share only ``context`` (the settings, the runtime, the repository root).

- ``run`` - ``run`` (the whole stack, on an embedded broker unless CELERY_BROKER_URL is set),
  ``flower`` and ``env``; ``mqtt`` - the MQTT bridge; ``grpc_door`` - ``grpc``, the gRPC door.
- ``configuration`` - ``config``; ``database`` - ``init-db`` and ``new-migration``.
- ``status`` - workers, queues and dead letters at a glance; ``dead_letters`` - ``dlq``;
  ``retention`` - deleting now what retention would.
- ``keys`` - API keys and their usage; ``encryption`` - keys at rest and rotation.
- ``models`` - the models served, hot swaps and shadow comparison; ``convert`` -
  ``convert-model``; ``dataset`` - the training-data export.
"""

from __future__ import annotations

import click

from .configuration import show_config
from .convert import convert_model
from .database import init_db, new_migration
from .dataset import dataset
from .dead_letters import dlq
from .encryption import encryption
from .grpc_door import grpc_door
from .keys import keys
from .models import models
from .mqtt import mqtt
from .retention import retention
from .run import env, flower, run
from .status import status


@click.group()
def cli() -> None:
    """whisperq: self-hosted speech to text on a Celery queue."""


for _command in (
    show_config,
    init_db,
    new_migration,
    convert_model,
    status,
    retention,
    dlq,
    keys,
    encryption,
    dataset,
    models,
    run,
    flower,
    env,
    mqtt,
    grpc_door,
):
    cli.add_command(_command)

__all__ = ["cli"]
