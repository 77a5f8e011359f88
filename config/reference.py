"""The configuration reference, generated: `python -m config.reference [PATH]` writes the
Markdown page (to stdout without PATH).

Every Settings field's row comes from its declaration (config.settings, config.declare). The
variables read elsewhere are listed in OTHERS below, with their names and defaults taken from
their modules where those name them: the MQTT bridge's (config.mqtt, read by `whisperq mqtt`
only), the gRPC server's (config.grpc, `whisperq grpc`), the Procfile's, OpenTelemetry's
(config.tracing) and the ones the workers set for themselves. tests/test_config.py checks that
every variable the source reads is here.
"""

from __future__ import annotations

import sys
from dataclasses import fields
from pathlib import Path

from . import grpc
from .declare import GROUPS, Var, declared
from .mqtt import MAX_QUEUE, PROTOCOLS, QUEUE_VARIABLE, URL_VARIABLE
from .settings import Settings

TITLE = "Configuration reference"
INTRO = (
    "All settings come from the environment. Every process reads them at start, and a bad value stops it "
    "there with a message that names the variable and says what to set it to; `whisperq config` prints "
    "the settings in force, secrets masked.\n\n"
    "This page is generated from the settings' declarations (`python -m config.reference PATH`); change "
    "a setting's declaration in `config/settings.py`, not this page."
)
_MQTT = "MQTT bridge"
_WORKERS = "Batching & workers"
_GRPC = "gRPC server"
_TRACING = "Logs & tracing"

# Variables read outside Settings: (name, group, type, default, accepts, what it does).
OTHERS: tuple[Var, ...] = tuple(
    Var(*row)
    for row in (
        # config.mqtt: MqttSettings, read by `whisperq mqtt` only
        (
            URL_VARIABLE,
            _MQTT,
            "URL",
            "unset: no MQTT bridge",
            "mqtt://USER:PASSWORD@HOST:1883, or mqtts://…:8883 for TLS",
            "The MQTT broker of the bridge (`whisperq mqtt`, the Procfile's mqtt line); its password is masked in "
            "`whisperq config`.",
        ),
        (
            "WHISPERQ_MQTT_CLIENTS",
            _MQTT,
            "client list",
            "none: clients act anonymously where that is allowed",
            "NAME=KEY_ID, comma separated; *=KEY_ID for any other client",
            "The API key each MQTT client's jobs belong to (ids from `whisperq keys list`).",
        ),
        (
            "WHISPERQ_MQTT_REQUEST_TOPIC",
            _MQTT,
            "topic",
            "whisperq/requests/+",
            "a topic with exactly one + level and no #",
            "The topic the bridge takes requests from; its + level is the requesting client's name.",
        ),
        (
            "WHISPERQ_MQTT_REPLY_PREFIX",
            _MQTT,
            "topic",
            "whisperq/replies",
            "a topic without wildcards",
            "Replies go to PREFIX/<client>, or to a topic under it that the request names.",
        ),
        (
            "WHISPERQ_MQTT_CLIENT_ID",
            _MQTT,
            "text",
            "whisperq-bridge",
            "1 to 128 printable characters",
            "The bridge's fixed MQTT client id, whose persistent session keeps requests sent while it is away; "
            "one bridge per id.",
        ),
        (
            "WHISPERQ_MQTT_SESSION_EXPIRY",
            _MQTT,
            "duration",
            "7d",
            "seconds, or a number with s, m, h or d; off for ever",
            "MQTT v5: how long the broker keeps the bridge's session (and the requests for it) while it is away.",
        ),
        ("WHISPERQ_MQTT_PROTOCOL", _MQTT, "choice", PROTOCOLS[0], ", ".join(PROTOCOLS), "The MQTT protocol version."),
        (
            "WHISPERQ_MQTT_CA",
            _MQTT,
            "path",
            "the system's CAs",
            "a PEM file (with mqtts:// only)",
            "The CA bundle that signed the broker's certificate.",
        ),
        (
            QUEUE_VARIABLE,
            _MQTT,
            "integer",
            "100",
            f"1 to {MAX_QUEUE}",
            "Requests the bridge holds at once (also its MQTT v5 Receive Maximum); with that many it reads no more and "
            "the broker keeps the rest.",
        ),
        # config.grpc: GrpcSettings, read by `whisperq grpc` only
        (
            grpc.ADDRESS_VARIABLE,
            _GRPC,
            "address",
            grpc.DEFAULT_ADDRESS,
            "an IP address or host name",
            "The address the gRPC server listens on: loopback by default, 0.0.0.0 for every interface.",
        ),
        (grpc.PORT_VARIABLE, _GRPC, "integer", str(grpc.DEFAULT_PORT), "0 to 65535", "The gRPC server's port."),
        (
            grpc.THREADS_VARIABLE,
            _GRPC,
            "integer",
            str(grpc.DEFAULT_THREADS),
            "2 to 10000",
            "Calls the gRPC server serves at once (each stream, Upload or WatchJob, holds one while it lasts).",
        ),
        (
            grpc.STREAMS_VARIABLE,
            _GRPC,
            "integer",
            "half the threads",
            "1 to one below the threads",
            "Streams (Upload, WatchJob) open at once server-wide; the other threads stay for unary calls and health "
            "checks. A stream past it is refused (RESOURCE_EXHAUSTED).",
        ),
        (
            grpc.PER_CLIENT_VARIABLE,
            _GRPC,
            "integer",
            str(grpc.DEFAULT_PER_CLIENT),
            "1 to the streams",
            "Streams one client (its API key, else its address) may hold at once.",
        ),
        (
            grpc.IDLE_VARIABLE,
            _GRPC,
            "seconds",
            f"{grpc.DEFAULT_IDLE:g}",
            "1 or more",
            "An Upload that sends nothing for this long is ended.",
        ),
        (
            grpc.CALL_SECONDS_VARIABLE,
            _GRPC,
            "seconds",
            f"{grpc.DEFAULT_CALL:g}",
            "10 or more",
            "The longest a call lasts: an Upload is ended, a WatchJob ends (the client watches again).",
        ),
        (
            grpc.READS_VARIABLE,
            _GRPC,
            "rate",
            grpc.DEFAULT_READS,
            "N/second, N/minute, or off",
            "GetJob, WatchJob and Cancel per client, counted in the gRPC process's memory.",
        ),
        (
            grpc.PLAINTEXT_VARIABLE,
            _GRPC,
            "boolean",
            "false",
            "true or false",
            "Let the gRPC server listen beyond loopback without TLS, where a proxy or mesh in front of it does TLS.",
        ),
        (
            grpc.REFLECTION_VARIABLE,
            _GRPC,
            "boolean",
            "false",
            "true or false",
            "Serve gRPC server reflection (grpcurl's list and describe without the .proto).",
        ),
        (
            grpc.CERT_VARIABLE,
            _GRPC,
            "path",
            "unset (plaintext)",
            "a PEM certificate chain, with the key below",
            "With the key, turns TLS on for the gRPC server.",
        ),
        (
            grpc.KEY_VARIABLE,
            _GRPC,
            "path",
            "unset (plaintext)",
            "a PEM private key, with the certificate above",
            "The private key of the gRPC server's certificate; set both or neither.",
        ),
        # the Procfile (and deploy/): how many of each worker, and which queues
        (
            "WHISPERQ_PREPARE_CONCURRENCY",
            _WORKERS,
            "integer",
            "1",
            "1 or more",
            "Processes of the Procfile's prepare line.",
        ),
        (
            "WHISPERQ_NOTIFY_CONCURRENCY",
            _WORKERS,
            "integer",
            "8",
            "1 or more",
            "Threads of the Procfile's notify line.",
        ),
        (
            "WHISPERQ_ANALYSIS_CONCURRENCY",
            _WORKERS,
            "integer",
            "1",
            "1 or more",
            "Processes of the Procfile's analysis line (speakers, redaction: docs/analyses/index.md).",
        ),
        (
            "WHISPERQ_POOL_NICE",
            _WORKERS,
            "integer",
            "10",
            "-20 to 19",
            "Scheduling priority (nice) of the prepare and inference lines, so the web process stays responsive.",
        ),
        (
            "WHISPERQ_INFERENCE_QUEUES",
            _WORKERS,
            "queue list",
            "whisperq.inference (`whisperq run`: every model's queue)",
            "whisperq.inference, whisperq.inference.NAME, comma separated",
            "The queues the Procfile's inference process consumes: the models it loads.",
        ),
        (
            "WHISPERQ_WORKER_ID",
            _WORKERS,
            "text",
            "set by each worker at start",
            "not for operators to set",
            "A worker process's own id (hostname and a random part), which its claims and heartbeats carry.",
        ),
        (
            "PROMETHEUS_MULTIPROC_DIR",
            "Metrics & alerts",
            "directory",
            "a temporary directory per prefork worker",
            "a directory only this worker uses",
            "Where a prefork worker's processes keep their metrics for its /metrics.",
        ),
        # config.tracing; the OpenTelemetry SDK reads the other standard OTEL_* variables itself
        (
            "OTEL_EXPORTER_OTLP_ENDPOINT",
            _TRACING,
            "URL",
            "unset (tracing off)",
            "an OTLP/HTTP collector's URL",
            "Turns tracing on: spans go there over OTLP/HTTP (needs the [otel] extra).",
        ),
        (
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
            _TRACING,
            "URL",
            "unset",
            "an OTLP/HTTP traces URL",
            "Like OTEL_EXPORTER_OTLP_ENDPOINT, for traces alone.",
        ),
        (
            "OTEL_SDK_DISABLED",
            _TRACING,
            "true/false",
            "false",
            "true, false",
            "true turns tracing off whatever is set.",
        ),
        (
            "OTEL_SERVICE_NAME",
            _TRACING,
            "text",
            "whisperq-<process> (web, prepare, inference, notify, …)",
            "a name",
            "The service name spans carry.",
        ),
    )
)


def variables() -> list[Var]:
    """Every variable, in the reference's order: by group, Settings' in declaration order first."""
    rows = []
    for f in fields(Settings):
        rows += [declared(f).var(), *declared(f).also]
    rows += OTHERS
    return sorted(rows, key=lambda var: GROUPS.index(var.group))  # stable: declaration order within a group


def _cell(text: str) -> str:
    """Text for a table cell: pipes escaped, and angle brackets, which Markdown would take for HTML."""
    return text.replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;").replace("\n", " ")


def render() -> str:
    rows = variables()
    out = [f"# {TITLE}", "", INTRO, ""]
    for group in GROUPS:
        mine = [var for var in rows if var.group == group]
        if not mine:
            continue
        out += [f"## {group}", "", "| variable | type | default | accepts | what it does |", "|---|---|---|---|---|"]
        out += [
            f"| `{var.name}` | {_cell(var.kind)} | {_cell(var.default)} | {_cell(var.bounds)} | {_cell(var.doc)} |"
            for var in mine
        ]
        out.append("")
    return "\n".join(out)


def main(argv: list[str]) -> int:
    """`python -m config.reference [PATH]` writes the page (to stdout without PATH);
    `--check PATH` fails, saying how to mend it, where the page in PATH is not what the
    declarations write (the page is checked in, so that it reads the same on the repository's site)."""
    check = argv[:1] == ["--check"]
    paths = argv[1:] if check else argv
    if len(paths) > 1 or (check and not paths):
        print("usage: python -m config.reference [--check] [PATH]", file=sys.stderr)
        return 2
    text = render()
    if check:
        path = Path(paths[0])
        if not path.exists() or path.read_text() != text:
            print(
                f"{path} is not what config/settings.py declares: run `make reference` and commit it",
                file=sys.stderr,
            )
            return 1
    elif paths:
        Path(paths[0]).write_text(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
