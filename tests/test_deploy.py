"""Static checks of the deployment files in deploy/ (compose.yaml, whisperq.env.example,
k8s/): they parse; every Procfile process runs there with its Procfile line; they name only
settings the code reads; the grace periods cover the hard time limits; KEDA scales
Deployments that exist; no real secret is written down, the examples' placeholders are
refused at start, and each process gets only its own secrets; every pod is locked down
(non-root, no privilege, no capability, no service account token) behind NetworkPolicies.
Nothing here needs a Docker engine or a cluster, and no docker or kubectl CLI is used where
one is installed. (`make check-deploy` scans the same files with checkov.)"""

from __future__ import annotations

import ast
import re
import shlex
from pathlib import Path

import pytest
import yaml

from config import ConfigError, Settings
from config.mqtt import MqttSettings

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "k8s"
COMPOSE = DEPLOY / "compose.yaml"
ENV_EXAMPLE = DEPLOY / "whisperq.env.example"
# The backing services' and Flower's own env files (compose.yaml), next to whisperq.env.
OWN_ENV = {name: DEPLOY / f"{name}.env.example" for name in ("postgres", "redis", "rabbitmq", "flower")}
SECRET_EXAMPLE = K8S / "secret.example.yaml"
PLACEHOLDER = "CHANGE-ME"
# What a placeholder becomes where a test needs values the service accepts.
FILLED = "Zq3vN8pL2xR7tY5wK9mB4cD6"
# The names of settings, and of the variables whose values are secrets.
SETTING = re.compile(r"\b(?:WHISPERQ_[A-Z0-9_]*[A-Z0-9]|CELERY_[A-Z_]*[A-Z]|DATABASE_URL|FLOWER_[A-Z_]*[A-Z])\b")
SECRET_NAME = re.compile(r"PASSWORD|PASS$|SECRET|TOKEN|ENCRYPTION_KEYS|BASIC_AUTH")


# --- the normaliser: a command as the shell would run it, as an argv list --------------------

_PARAM = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?)-([^}]*))?\}|\$([A-Za-z_][A-Za-z0-9_]*)")


def expand(text: str, env: dict[str, str] | None = None) -> str:
    """The shell's ${VAR:-default}, ${VAR-default}, ${VAR} and $VAR (no nesting, as the Procfile
    writes them); with no env, every variable is unset and takes its default."""
    env = env or {}

    def one(m: re.Match) -> str:
        if m.group(4):
            return env.get(m.group(4), "")
        name, colon, default = m.group(1), m.group(2), m.group(3)
        if default is None:
            return env.get(name, "")
        value = env.get(name)
        return default if value is None or (colon and value == "") else value

    return _PARAM.sub(one, text)


def shell_argv(script: str, env: dict[str, str] | None = None) -> list[str]:
    """A shell line's argv after expansion, with a leading `exec` left out."""
    argv = shlex.split(expand(script, env))
    return argv[1:] if argv[:1] == ["exec"] else argv


def container_argv(argv: list[str], compose: bool = False) -> list[str]:
    """What a container's command runs: `sh -c SCRIPT` is SCRIPT's argv. In Compose `$$` is a
    `$` left to the container's shell; a lone `$` would be Compose's own interpolation, from
    the environment of whoever runs `docker compose` and not from the env file."""
    argv = [str(a) for a in argv]
    if compose:
        for arg in argv:
            lone = re.sub(r"\$\$", "", arg)
            assert "$" not in lone, f"{arg!r}: write $$ for the container's shell (a lone $ is Compose's)"
        argv = [a.replace("$$", "$") for a in argv]
    if len(argv) == 3 and argv[0] in ("sh", "/bin/sh") and argv[1] == "-c":
        return shell_argv(argv[2])
    return [expand(a) for a in argv]


def procfile() -> dict[str, list[str]]:
    out = {}
    for line in (ROOT / "Procfile").read_text().splitlines():
        if line.strip() and not line.lstrip().startswith("#"):
            name, command = line.split(":", 1)
            out[name.strip()] = shell_argv(command.strip())
    return out


def test_the_normaliser_follows_the_shell():
    assert expand("${A:-1} ${B-2} ${C} $D") == "1 2  "
    assert expand("${A:-1} ${B-2}", {"A": "", "B": ""}) == "1 "
    assert expand("${A:-1}/x", {"A": "y"}) == "y/x"
    assert shell_argv("exec nice -n ${N:-10} celery --hostname prepare@%h") == [
        "nice",
        "-n",
        "10",
        "celery",
        "--hostname",
        "prepare@%h",
    ]
    assert container_argv(["sh", "-c", "exec a $${X:-1}"], compose=True) == ["a", "1"]
    with pytest.raises(AssertionError):
        container_argv(["sh", "-c", "exec a ${X:-1}"], compose=True)
    assert procfile()["flower"] == ["whisperq", "flower"]


# --- loading ----------------------------------------------------------------------------------


def yaml_files() -> list[Path]:
    return sorted(p for p in DEPLOY.rglob("*") if p.suffix in (".yaml", ".yml"))


def manifests(applied: bool = False) -> list[dict]:
    """Every manifest in deploy/k8s (applied=True: only those kustomization.yaml applies)."""
    listed = set(yaml.safe_load((K8S / "kustomization.yaml").read_text())["resources"]) if applied else None
    docs = []
    for path in sorted(K8S.glob("*.yaml")):
        if path.name != "kustomization.yaml" and (listed is None or path.name in listed):
            docs += [d for d in yaml.safe_load_all(path.read_text()) if d]
    return docs


def of_kind(kind: str) -> dict[str, dict]:
    return {d["metadata"]["name"]: d for d in manifests() if d["kind"] == kind}


def compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


def env_file(path: Path = ENV_EXAMPLE, commented: bool = False) -> dict[str, str]:
    """NAME=value lines (with commented=True, also `# NAME=value` ones)."""
    out = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if commented and re.match(r"#\s*[A-Z][A-Z0-9_]*=", line):
            line = line.lstrip("#").strip()
        m = re.match(r"([A-Z][A-Z0-9_]*)=(.*)$", line)
        if m:
            out.setdefault(m.group(1), m.group(2).strip())
    return out


def config_map() -> dict[str, str]:
    return of_kind("ConfigMap")["whisperq-config"]["data"]


def secrets() -> dict[str, dict[str, str]]:
    """secret.example.yaml's Secrets, by name: their keys."""
    return {name: d["stringData"] for name, d in of_kind("Secret").items()}


def secret() -> dict[str, str]:
    """Every key of the example Secrets together (no key is in two of them)."""
    merged: dict[str, str] = {}
    for data in secrets().values():
        assert not set(data) & set(merged), set(data) & set(merged)
        merged.update(data)
    return merged


def filled(env: dict[str, str]) -> dict[str, str]:
    """An example environment with its placeholders replaced by values the service accepts."""
    return {k: v.replace(PLACEHOLDER, FILLED) for k, v in env.items()}


def deployment_of(process: str) -> dict:
    found = [
        d
        for d in of_kind("Deployment").values()
        if d["spec"]["template"]["metadata"]["labels"].get("app.kubernetes.io/component") == process
    ]
    assert len(found) == 1, f"{len(found)} Deployments for the Procfile's {process!r} (by app.kubernetes.io/component)"
    return found[0]


def container_of(deployment: dict) -> dict:
    containers = deployment["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 1, deployment["metadata"]["name"]
    return containers[0]


def not_secret(env: dict[str, str]) -> dict[str, str]:
    """An environment without its secrets (placeholders that refuse to parse, on purpose)."""
    return {k: v for k, v in env.items() if not SECRET_NAME.search(k)}


# --- the checks -------------------------------------------------------------------------------


def test_every_deployment_file_parses():
    assert {p.name for p in yaml_files()} >= {"compose.yaml", "kustomization.yaml", "keda-scaledobject.yaml"}
    for path in yaml_files():
        docs = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
        assert docs and all(isinstance(d, dict) for d in docs), path
    for doc in manifests():
        assert {"apiVersion", "kind", "metadata"} <= set(doc), doc
    assert (DEPLOY / "Dockerfile").read_text().startswith("# syntax=docker/dockerfile:1")


def test_kustomization_lists_every_manifest_but_the_example_secret():
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    listed = kustomization["resources"]
    assert len(listed) == len(set(listed))
    assert set(listed) == {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml", SECRET_EXAMPLE.name}
    # The example Secrets are never applied: no Secret comes with `kubectl apply -k`, and the
    # kustomization says how to make them.
    assert SECRET_EXAMPLE.name not in listed and not [d for d in manifests(applied=True) if d["kind"] == "Secret"]
    assert {d["kind"] for d in yaml.safe_load_all(SECRET_EXAMPLE.read_text()) if d} == {"Secret"}
    text = (K8S / "kustomization.yaml").read_text()
    for name in secrets():
        assert re.search(rf"kubectl -n whisperq create secret generic {name} +--from-env-file=", text), name
    namespaces = of_kind("Namespace")
    assert list(namespaces) == [kustomization["namespace"]]
    assert "keda-scaledobject.yaml" in listed and not (DEPLOY / "keda-scaledobject.yaml").exists()


def test_compose_runs_every_procfile_process_with_its_line():
    services = compose()["services"]
    for name, argv in procfile().items():
        assert name in services, f"compose.yaml has no service for the Procfile's {name!r}"
        assert container_argv(services[name]["command"], compose=True) == argv, name


def test_kubernetes_runs_every_procfile_process_with_its_line():
    for name, argv in procfile().items():
        container = container_of(deployment_of(name))
        assert container_argv(container.get("command", []) + container.get("args", [])) == argv, name


def test_deployment_files_name_only_settings_the_code_reads():
    read = set(SETTING.findall((ROOT / "Procfile").read_text()))
    for path in (ROOT / "config").rglob("*.py"):
        read |= set(SETTING.findall(path.read_text()))
    assert {"WHISPERQ_STORAGE", "DATABASE_URL", "CELERY_BROKER_URL", "WHISPERQ_ENCRYPTION_KEYS"} <= read
    files = [COMPOSE, ENV_EXAMPLE, *OWN_ENV.values(), DEPLOY / "Dockerfile", *sorted(K8S.glob("*.yaml"))]
    for path in files:
        unknown = set(SETTING.findall(path.read_text())) - read
        assert not unknown, (
            f"{path.relative_to(ROOT)} names settings that config/ and the Procfile never read: {unknown}"
        )


def test_the_settings_given_are_valid():
    """The ConfigMap with the Secret's URLs, and compose's environment with the example env
    files, pass Settings once their placeholders are replaced (secrets aside: those
    placeholders refuse to parse, which the next tests check)."""
    urls = filled({k: secret()[k] for k in ("DATABASE_URL", "CELERY_BROKER_URL")})
    settings = Settings.from_env({**config_map(), **urls})
    assert settings.storage == "postgres" and settings.host == "0.0.0.0"
    # Flower: the ConfigMap, its own env entries and only the secrets it is given.
    container = container_of(deployment_of("flower"))
    given = {
        e["name"]: (e["value"] if "value" in e else secret()[e["valueFrom"]["secretKeyRef"]["key"]])
        for e in container["env"]
    }
    assert Settings.from_env(filled({**config_map(), **given})).flower_basic_auth
    services = compose()["services"]
    for name in procfile():
        source = env_file(OWN_ENV["flower"]) if name == "flower" else env_file()
        env = {
            **filled(not_secret(source)),
            **{k: str(v) for k, v in (services[name].get("environment") or {}).items()},
        }
        settings = Settings.from_env(env)
        if name == "flower":  # no database: only the broker
            assert settings.storage == "local" and settings.broker_url.startswith("redis://"), name
        else:
            assert settings.storage == "postgres" and settings.database_url.startswith("postgresql"), name


def test_the_examples_secrets_are_refused_at_start(tmp_path):
    """Each placeholder of the examples (env files and Secrets) stops the service at start,
    with a message that names the setting and says how to make a real value."""
    examples = {**env_file(commented=True), **env_file(OWN_ENV["flower"], commented=True), **secret()}
    checked = set()
    for name, value in examples.items():
        if PLACEHOLDER not in value or name.startswith(("POSTGRES_", "REDIS_PASSWORD", "RABBITMQ_")):
            continue  # the servers' own passwords: whisperq reads them only inside its URLs
        if name == "WHISPERQ_MQTT_CLIENTS":
            continue  # key ids, not secrets
        with pytest.raises(ConfigError) as err:
            if name == "WHISPERQ_MQTT_URL":  # read by the MQTT bridge (config.mqtt), not Settings
                MqttSettings.from_env({name: value})
            else:
                Settings.from_env({"WHISPERQ_DATA_DIR": str(tmp_path), name: value})
        assert str(err.value).startswith(name), (name, str(err.value))
        assert "python" in str(err.value) or "new-key" in str(err.value), str(err.value)
        checked.add(name)
    assert checked >= {
        "WHISPERQ_ADMIN_TOKEN",
        "WHISPERQ_SECRET_KEY",
        "WHISPERQ_METRICS_TOKEN",
        "WHISPERQ_WEBHOOK_SECRET",
        "WHISPERQ_ENCRYPTION_KEYS",
        "FLOWER_BASIC_AUTH",
        "DATABASE_URL",
        "CELERY_BROKER_URL",
        "WHISPERQ_REDIS_URL",
        "WHISPERQ_MQTT_URL",
    }


def test_no_real_secrets_are_written_down():
    example = env_file(commented=True)
    own = {name: env_file(path, commented=True) for name, path in OWN_ENV.items()}
    for path, source in [(ENV_EXAMPLE, example), *((OWN_ENV[n], own[n]) for n in own)]:
        for name, value in source.items():
            if SECRET_NAME.search(name):
                assert value == "" or PLACEHOLDER in value, f"{path.name}: {name} must be an example ({PLACEHOLDER})"
    for name, value in secret().items():
        assert PLACEHOLDER in value, f"secret.example.yaml: {name} must be an example ({PLACEHOLDER})"
    for source in (example, secret(), *own.values()):
        for name, value in source.items():
            if "://" in value and "@" in value:  # a password inside a URL
                assert PLACEHOLDER in value.split("@", 1)[0], f"{name}: the URL's password must be an example"

    # The URLs carry the same passwords as the servers are given (each in its own file).
    def password(url: str) -> str:
        return url.split("://", 1)[1].split("@", 1)[0].split(":", 1)[1]

    assert password(example["DATABASE_URL"]) == own["postgres"]["POSTGRES_PASSWORD"]
    assert password(example["CELERY_BROKER_URL"]) == own["redis"]["REDIS_PASSWORD"]
    assert password(example["WHISPERQ_REDIS_URL"]) == own["redis"]["REDIS_PASSWORD"]
    k8s = secrets()
    assert password(secret()["DATABASE_URL"]) == k8s["whisperq-postgres"]["POSTGRES_PASSWORD"]
    assert password(secret()["CELERY_BROKER_URL"]) == k8s["whisperq-redis"]["REDIS_PASSWORD"]
    amqp = [v for v in ENV_EXAMPLE.read_text().split() if v.startswith("CELERY_BROKER_URL=amqp")]
    assert amqp and password(amqp[0].split("=", 1)[1]) == own["rabbitmq"]["RABBITMQ_DEFAULT_PASS"]
    assert amqp[0].split("//", 1)[1].split(":", 1)[0] == own["rabbitmq"]["RABBITMQ_DEFAULT_USER"]
    # Flower's broker is whisperq's (both lines: Redis, and RabbitMQ commented).
    flower_text = OWN_ENV["flower"].read_text()
    assert env_file(OWN_ENV["flower"])["CELERY_BROKER_URL"] == env_file()["CELERY_BROKER_URL"]
    assert amqp[0] in flower_text
    # Placeholders that would work as keys are refused at start instead.
    from config.env import Env
    from config.keys import parse_keys

    for source in (example, secret()):
        with pytest.raises(ValueError):
            parse_keys(source["WHISPERQ_ENCRYPTION_KEYS"])
        with pytest.raises(ConfigError):
            Env(source).webhook_secret("WHISPERQ_WEBHOOK_SECRET")
    # Nothing that looks like a real key anywhere, and no secret in compose.yaml itself.
    real_looking = re.compile(
        r"whsec_[A-Za-z0-9+/]{20,}|\bwq_[A-Za-z0-9_-]{16,}|[A-Za-z0-9_-]+:[A-Za-z0-9+/_-]{43}="
        r"|-----BEGIN|://[^:/\s]*:(?!CHANGE-ME)[^@\s]+@"
    )
    for path in [COMPOSE, ENV_EXAMPLE, *OWN_ENV.values(), DEPLOY / "Dockerfile", *sorted(K8S.glob("*.yaml"))]:
        found = real_looking.findall(path.read_text())
        assert not found, f"{path.relative_to(ROOT)} holds what looks like a real secret: {found}"
    for name, service in compose()["services"].items():
        for var in service.get("environment") or {}:
            assert not SECRET_NAME.search(var), f"compose.yaml sets {var} for {name}: secrets belong in the env files"
    # The real env files stay out of Git and out of the image.
    for ignore in (ROOT / ".gitignore", DEPLOY / "Dockerfile.dockerignore"):
        assert "deploy/*.env" in ignore.read_text().split("\n"), ignore.name


def test_grace_periods_cover_the_longest_job():
    """SIGTERM is Celery's warm shutdown: a worker finishes the jobs it runs, each at most its
    hard time limit for the longest audio allowed (Settings.prepare_time_limit, time_limit)."""

    def limits(env: dict[str, str]) -> dict[str, float]:
        s = Settings.from_env({k: v for k, v in env.items() if k == "WHISPERQ_MAX_AUDIO_SECONDS"})
        return {"prepare": s.prepare_time_limit(s.max_audio_seconds), "inference": s.time_limit(s.max_audio_seconds)}

    def seconds(text: str) -> float:
        parts = re.fullmatch(r"(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?", str(text))
        assert parts and any(parts.groups()), text
        h, m, s = (int(g or 0) for g in parts.groups())
        return h * 3600 + m * 60 + s

    services = compose()["services"]
    for pool, limit in limits(config_map()).items():
        grace = deployment_of(pool)["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
        assert limit < grace <= limit + 600, f"{pool}: terminationGracePeriodSeconds {grace} for a {limit} s limit"
    for pool, limit in limits(env_file()).items():
        grace = seconds(services[pool]["stop_grace_period"])
        assert limit < grace <= limit + 600, f"compose {pool}: stop_grace_period {grace} s for a {limit} s limit"
    assert config_map().get("WHISPERQ_MAX_AUDIO_SECONDS") == env_file().get("WHISPERQ_MAX_AUDIO_SECONDS")


def test_exactly_one_beat():
    beat = deployment_of("beat")
    assert beat["spec"]["replicas"] == 1 and beat["spec"]["strategy"]["type"] == "Recreate"
    service = compose()["services"]["beat"]
    assert service.get("deploy", {}).get("replicas", 1) == 1
    scaled = {d["spec"]["scaleTargetRef"]["name"] for d in of_kind("ScaledObject").values()}
    assert beat["metadata"]["name"] not in scaled


def test_scaled_objects_scale_deployments_that_exist():
    deployments = of_kind("Deployment")
    scaled = of_kind("ScaledObject")
    targets = {}
    for name, so in scaled.items():
        ref = so["spec"]["scaleTargetRef"]
        assert ref.get("kind", "Deployment") == "Deployment" and ref["name"] in deployments, name
        assert so["spec"]["minReplicaCount"] >= 1, f"{name}: /readyz and the sweeper want a live worker"
        target = deployments[ref["name"]]
        assert "replicas" not in target["spec"], f"{ref['name']}: KEDA owns its replicas"
        targets[target["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/component"]] = so
    assert set(targets) == {"prepare", "inference"}
    inference = targets["inference"]["spec"]["triggers"][0]["metadata"]
    prepare = targets["prepare"]["spec"]["triggers"][0]["metadata"]
    # One replica carries the jobs it holds at once.
    assert int(inference["threshold"]) == int(config_map()["WHISPERQ_INFERENCE_SLOTS"])
    assert prepare["query"] == inference["query"].replace("whisperq.inference", "whisperq.prepare")
    assert prepare["serverAddress"] == inference["serverAddress"]


def test_ports_probes_and_names_agree():
    cm = config_map()
    offsets = ast.literal_eval(
        re.search(r"^OFFSETS = (\{.*\})$", (ROOT / "tasks" / "metrics.py").read_text(), re.M).group(1)
    )
    services = compose()["services"]
    # web: listens on PORT; ready on /readyz, alive on /healthz; its Service points there.
    web = container_of(deployment_of("web"))
    assert [p["containerPort"] for p in web["ports"]] == [int(cm["PORT"])]
    assert web["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert web["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert "/readyz" in str(services["web"]["healthcheck"]["test"])
    assert services["web"]["ports"] == [f"{cm['PORT']}:{services['web']['environment']['PORT']}"]
    # Workers' own /metrics: WHISPERQ_METRICS_PORT plus their pool's offset.
    for pool, offset in offsets.items():
        port = int(cm["WHISPERQ_METRICS_PORT"]) + offset
        deployment = deployment_of(pool)
        assert [p["containerPort"] for p in container_of(deployment)["ports"]] == [port], pool
        assert deployment["spec"]["template"]["metadata"]["annotations"]["prometheus.io/port"] == str(port)
        assert services[pool]["expose"] == [str(int(services[pool]["environment"]["WHISPERQ_METRICS_PORT"]) + offset)]
    # Flower listens beyond loopback, so it has a login.
    assert [p["containerPort"] for p in container_of(deployment_of("flower"))["ports"]] == [int(cm["FLOWER_PORT"])]
    assert services["flower"]["ports"] == [f"127.0.0.1:{services['flower']['environment']['FLOWER_PORT']}:5555"]
    assert "FLOWER_BASIC_AUTH" in secrets()["whisperq-flower"] and "FLOWER_BASIC_AUTH" in env_file(OWN_ENV["flower"])
    # The gRPC door: listens on every address of its pod or container on WHISPERQ_GRPC_PORT,
    # ready on grpc.health.v1 (Kubernetes' grpc probe, compose's healthcheck), published on
    # the host's loopback only; its Service points there and takes calls from the cluster only.
    from config.grpc import GrpcSettings

    door = container_of(deployment_of("grpc"))
    env = {e["name"]: e["value"] for e in door["env"]}
    grpc_port = GrpcSettings.from_env(env).port
    assert GrpcSettings.from_env(env).address == "0.0.0.0"
    assert [p["containerPort"] for p in door["ports"]] == [grpc_port]
    assert door["readinessProbe"]["grpc"]["port"] == grpc_port
    (grpc_service,) = [
        s for s in of_kind("Service").values() if s["spec"]["selector"]["app.kubernetes.io/component"] == "grpc"
    ]
    assert [p["port"] for p in grpc_service["spec"]["ports"]] == [grpc_port]
    compose_door = GrpcSettings.from_env({k: str(v) for k, v in services["grpc"]["environment"].items()})
    assert compose_door.address == "0.0.0.0" and compose_door.port == grpc_port
    assert services["grpc"]["ports"] == [f"127.0.0.1:{grpc_port}:{grpc_port}"]
    assert "grpc_health.v1" in str(services["grpc"]["healthcheck"]["test"]) and "SERVING" in str(
        services["grpc"]["healthcheck"]["test"]
    )
    # Each Service selects pods that exist and names a port they have.
    pods = {
        d["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/component"]: d
        for kind in ("Deployment", "StatefulSet")
        for d in of_kind(kind).values()
    }
    for name, svc in of_kind("Service").items():
        component = svc["spec"]["selector"]["app.kubernetes.io/component"]
        assert component in pods, name
        named = {
            p["name"] for c in pods[component]["spec"]["template"]["spec"]["containers"] for p in c.get("ports", [])
        }
        assert {p["targetPort"] for p in svc["spec"]["ports"]} <= named, name
    for name, sts in of_kind("StatefulSet").items():
        assert sts["spec"]["serviceName"] in of_kind("Service"), name


def test_kubernetes_service_links_cannot_shadow_a_setting():
    """Kubernetes puts NAME_PORT=tcp://… and NAME_SERVICE_HOST into pods for each Service
    (a Service named flower would set FLOWER_PORT): the pods turn that off, and no Service
    name would collide anyway."""
    read = set()
    for path in (ROOT / "config").rglob("*.py"):
        read |= set(SETTING.findall(path.read_text())) | set(re.findall(r'"([A-Z][A-Z0-9_]+)"', path.read_text()))
    for name in of_kind("Service"):
        prefix = name.upper().replace("-", "_")
        assert not {f"{prefix}_PORT", f"{prefix}_SERVICE_HOST", f"{prefix}_SERVICE_PORT"} & read, name
    for kind in ("Deployment", "StatefulSet"):
        for name, d in of_kind(kind).items():
            assert d["spec"]["template"]["spec"].get("enableServiceLinks") is False, name


def test_compose_services_restart_wait_for_their_backends_and_report_health():
    services = compose()["services"]
    assert {"redis", "postgres", "rabbitmq"} <= set(services)
    assert services["rabbitmq"]["profiles"] == ["rabbitmq"] and "profiles" not in services["redis"]
    for name, service in services.items():
        assert service.get("restart") == "unless-stopped", name
    for name in procfile():
        depends = services[name]["depends_on"]
        assert depends["postgres"]["condition"] == depends["redis"]["condition"] == "service_healthy", name
        assert depends["rabbitmq"]["required"] is False, name  # only with --profile rabbitmq
        assert "container_name" not in services[name], name  # would stop --scale
    assert "pg_isready" in str(services["postgres"]["healthcheck"]["test"])
    assert "redis-cli ping" in str(services["redis"]["healthcheck"]["test"])
    assert services["inference"]["deploy"]["replicas"] >= 1
    # The GPU variant is written down, commented, beside the inference service.
    text = COMPOSE.read_text()
    assert re.search(r"#\s*devices:\s*\n\s*#\s*- driver: nvidia", text)
    assert "nvidia.com/gpu" in (K8S / "inference.yaml").read_text()


# --- least privilege: what each pod may do, see and reach --------------------------------------

# the whisperq processes with whisperq-secrets
APP = {"web", "prepare", "inference", "notify", "analysis", "beat", "mqtt", "grpc"}


def workloads() -> dict[str, dict]:
    """Every pod template (Deployments and StatefulSets), by app.kubernetes.io/component."""
    return {
        d["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/component"]: d
        for kind in ("Deployment", "StatefulSet")
        for d in of_kind(kind).values()
    }


def secrets_used(workload: dict) -> set[tuple[str, str | None]]:
    """(Secret, key) pairs a workload's pods read; key None for the whole Secret (envFrom, a volume)."""
    pod = workload["spec"]["template"]
    used = set()
    for c in pod["spec"]["containers"] + pod["spec"].get("initContainers", []):
        used |= {(e["secretRef"]["name"], None) for e in c.get("envFrom", []) if "secretRef" in e}
        used |= {
            (e["valueFrom"]["secretKeyRef"]["name"], e["valueFrom"]["secretKeyRef"]["key"])
            for e in c.get("env", [])
            if "secretKeyRef" in e.get("valueFrom", {})
        }
    used |= {(v["secret"]["secretName"], None) for v in pod["spec"].get("volumes", []) if "secret" in v}
    return used


def test_every_pod_runs_locked_down():
    pods = workloads()
    assert set(pods) == APP | {"flower", "postgres", "redis"}
    for component, workload in pods.items():
        spec = workload["spec"]["template"]["spec"]
        assert spec.get("automountServiceAccountToken") is False, f"{component}: no service account token"
        pod = spec["securityContext"]
        assert pod["runAsNonRoot"] is True and pod["runAsUser"] >= 10000, component
        assert pod["seccompProfile"] == {"type": "RuntimeDefault"}, component
        assert not spec.get("hostNetwork") and not spec.get("hostPID") and not spec.get("hostIPC"), component
        mounts_of = {v["name"] for v in spec.get("volumes", [])} | {
            t["metadata"]["name"] for t in workload["spec"].get("volumeClaimTemplates", [])
        }
        for c in spec["containers"] + spec.get("initContainers", []):
            sc = c["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False and sc["runAsNonRoot"] is True, (component, c["name"])
            assert sc["capabilities"] == {"drop": ["ALL"]} and not sc.get("privileged"), (component, c["name"])
            assert sc["readOnlyRootFilesystem"] is True, (component, c["name"])
            assert sc["seccompProfile"] == {"type": "RuntimeDefault"}, (component, c["name"])
            assert "cpu" in c["resources"]["limits"] and "memory" in c["resources"]["limits"], (component, c["name"])
            assert {m["name"] for m in c.get("volumeMounts", [])} <= mounts_of, (component, c["name"])
            if component in APP | {"flower"}:  # a read-only root: temporary files go to an emptyDir
                assert "/tmp" in {m["mountPath"] for m in c["volumeMounts"]}, component
                assert ":" in c["image"] and c["imagePullPolicy"] == "Always", component


def test_each_pod_gets_only_its_own_secrets():
    pods = workloads()
    for component in APP:
        assert secrets_used(pods[component]) == {("whisperq-secrets", None)}, component
    # Flower: the broker and its login, nothing else of whisperq's (no database, no keys).
    assert secrets_used(pods["flower"]) == {
        ("whisperq-secrets", "CELERY_BROKER_URL"),
        ("whisperq-flower", "FLOWER_BASIC_AUTH"),
    }
    # The backing services: their own password, from a Secret holding nothing else.
    assert secrets_used(pods["postgres"]) == {("whisperq-postgres", None)}
    assert secrets_used(pods["redis"]) == {("whisperq-redis", None)}
    assert set(secrets()["whisperq-postgres"]) == {"POSTGRES_PASSWORD"}
    assert set(secrets()["whisperq-redis"]) == {"REDIS_PASSWORD"}
    assert set(secrets()["whisperq-flower"]) == {"FLOWER_BASIC_AUTH"}
    assert not {"POSTGRES_PASSWORD", "REDIS_PASSWORD", "FLOWER_BASIC_AUTH"} & set(secrets()["whisperq-secrets"])
    # The KEDA example authenticates to Redis with Redis's Secret, not whisperq's.
    assert "name: whisperq-secrets" not in (K8S / "keda-scaledobject.yaml").read_text()


def selects(selector: dict, labels: dict[str, str]) -> bool:
    """A Kubernetes label selector (matchLabels, matchExpressions In/NotIn/Exists) against labels."""
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for e in selector.get("matchExpressions") or []:
        value = labels.get(e["key"])
        if (
            (e["operator"] == "In" and value not in e["values"])
            or (e["operator"] == "NotIn" and value in e["values"])
            or (e["operator"] == "Exists" and value is None)
            or (e["operator"] == "DoesNotExist" and value is not None)
        ):
            return False
    return True


def test_network_policies_deny_by_default_and_open_only_whats_needed():
    policies = of_kind("NetworkPolicy")
    listed = yaml.safe_load((K8S / "kustomization.yaml").read_text())["resources"]
    assert "networkpolicy.yaml" in listed
    deny = [
        p
        for p in policies.values()
        if p["spec"]["podSelector"] == {} and not p["spec"].get("ingress") and not p["spec"].get("egress")
    ]
    assert deny and set(deny[0]["spec"]["policyTypes"]) == {"Ingress", "Egress"}
    labels = {c: w["spec"]["template"]["metadata"]["labels"] for c, w in workloads().items()}

    def allowed(direction: str, component: str) -> list[dict]:
        """The rules of `direction` (ingress/egress) that apply to the component's pods."""
        return [
            rule
            for p in policies.values()
            if selects(p["spec"]["podSelector"], labels[component])
            for rule in p["spec"].get(direction) or []
        ]

    def peers(rule: dict, key: str) -> set[str]:
        """The components of this namespace a rule's from/to names (all: no from/to at all)."""
        if key not in rule:
            return set(labels)
        return {
            c
            for peer in rule[key]
            if set(peer) == {"podSelector"}
            for c in labels
            if selects(peer["podSelector"], labels[c])
        }

    def ports(rule: dict) -> set[int]:
        return {p["port"] for p in rule.get("ports", [])}

    # Every pod is selected by a policy that opens something.
    for component in labels:
        assert allowed("ingress", component) or allowed("egress", component), component
    # Into the database: the whisperq processes only, on 5432; into Redis: those and Flower.
    into_db = set().union(*(peers(r, "from") for r in allowed("ingress", "postgres") if ports(r) == {5432}))
    assert into_db == APP, into_db
    into_redis = set().union(*(peers(r, "from") for r in allowed("ingress", "redis") if ports(r) == {6379}))
    assert into_redis == APP | {"flower"}, into_redis
    assert all(ports(r) == {5432} for r in allowed("ingress", "postgres"))
    assert all(ports(r) == {6379} for r in allowed("ingress", "redis"))
    assert not allowed("egress", "postgres") and not allowed("egress", "redis")
    # Out of the whisperq processes: the database and the broker.
    for component in APP:
        out = allowed("egress", component)
        assert any(peers(r, "to") == {"postgres"} and ports(r) == {5432} for r in out), component
        assert any(peers(r, "to") == {"redis"} and ports(r) == {6379} for r in out), component
    # Flower reaches the broker only (and DNS), never the database.
    flower_out = allowed("egress", "flower")
    assert not any("postgres" in peers(r, "to") for r in flower_out)
    assert any(peers(r, "to") == {"redis"} for r in flower_out)
    # The web takes traffic on its port; nothing else takes traffic from anywhere.
    assert any("from" not in r and ports(r) == {8000} for r in allowed("ingress", "web"))
    for component in set(labels) - {"web"}:
        assert all("from" in r for r in allowed("ingress", component)), component
    # Outbound to the internet (audio by URL, webhooks): never private or metadata addresses.
    for component in ("prepare", "notify"):
        blocks = [
            peer["ipBlock"] for r in allowed("egress", component) for peer in r.get("to", []) if "ipBlock" in peer
        ]
        assert blocks, component
        for block in blocks:
            if block["cidr"] == "0.0.0.0/0":
                assert {"10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "169.254.0.0/16"} <= set(block["except"])
    for component in ("web", "grpc", "inference", "beat", "flower"):
        assert not [r for r in allowed("egress", component) for peer in r.get("to", []) if "ipBlock" in peer], component


def test_compose_gives_whisperq_env_to_no_backing_service():
    services = compose()["services"]

    def env_files(service: dict) -> list[str]:
        value = service.get("env_file") or []
        return [v if isinstance(v, str) else v["path"] for v in ([value] if isinstance(value, (str, dict)) else value)]

    for name in ("redis", "postgres", "rabbitmq", "flower"):
        assert env_files(services[name]) == [f"{name}.env"], name
    for name in APP:
        assert env_files(services[name]) == ["whisperq.env"], name
    # Each own file holds its own keys, and whisperq.env none of them.
    own = {name: set(env_file(path, commented=True)) for name, path in OWN_ENV.items()}
    assert own["postgres"] == {"POSTGRES_PASSWORD"}
    assert own["redis"] == {"REDIS_PASSWORD"}
    assert own["rabbitmq"] == {"RABBITMQ_DEFAULT_USER", "RABBITMQ_DEFAULT_PASS"}
    assert own["flower"] == {"CELERY_BROKER_URL", "FLOWER_BASIC_AUTH"}
    assert not (own["postgres"] | own["redis"] | own["rabbitmq"] | {"FLOWER_BASIC_AUTH"}) & set(
        env_file(commented=True)
    )
    # The servers read their passwords from there: Redis through its shell, the images by name.
    assert "$$REDIS_PASSWORD" in str(services["redis"]["command"])
    assert "$$REDIS_PASSWORD" in str(services["redis"]["healthcheck"]["test"])
    # The whisperq containers run without capabilities and never gain privileges.
    for name in APP | {"flower"}:
        assert services[name]["cap_drop"] == ["ALL"] and "no-new-privileges:true" in services[name]["security_opt"]
