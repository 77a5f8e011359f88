"""Static checks of the deployment files in deploy/ (compose.yaml, whisperq.env.example,
k8s/): they parse; every Procfile process runs there with its Procfile line; they name only
settings the code reads; the grace periods cover the hard time limits; KEDA scales
Deployments that exist; no real secret is written down. Nothing here needs a Docker engine
or a cluster, and no docker or kubectl CLI is used where one is installed."""
from __future__ import annotations

import ast
import re
import shlex
from pathlib import Path

import pytest
import yaml

from config import ConfigError, Settings

ROOT = Path(__file__).resolve().parent.parent
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "k8s"
COMPOSE = DEPLOY / "compose.yaml"
ENV_EXAMPLE = DEPLOY / "whisperq.env.example"
PLACEHOLDER = "CHANGE-ME"
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
        "nice", "-n", "10", "celery", "--hostname", "prepare@%h"]
    assert container_argv(["sh", "-c", "exec a $${X:-1}"], compose=True) == ["a", "1"]
    with pytest.raises(AssertionError):
        container_argv(["sh", "-c", "exec a ${X:-1}"], compose=True)
    assert procfile()["flower"] == ["whisperq", "flower"]


# --- loading ----------------------------------------------------------------------------------

def yaml_files() -> list[Path]:
    return sorted(p for p in DEPLOY.rglob("*") if p.suffix in (".yaml", ".yml"))


def manifests() -> list[dict]:
    docs = []
    for path in sorted(K8S.glob("*.yaml")):
        if path.name != "kustomization.yaml":
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


def secret() -> dict[str, str]:
    return of_kind("Secret")["whisperq-secrets"]["stringData"]


def deployment_of(process: str) -> dict:
    found = [d for d in of_kind("Deployment").values()
             if d["spec"]["template"]["metadata"]["labels"].get("app.kubernetes.io/component") == process]
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


def test_kustomization_lists_every_manifest():
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    listed = kustomization["resources"]
    assert len(listed) == len(set(listed))
    assert set(listed) == {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
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
    files = [COMPOSE, ENV_EXAMPLE, DEPLOY / "Dockerfile", *sorted(K8S.glob("*.yaml"))]
    for path in files:
        unknown = set(SETTING.findall(path.read_text())) - read
        assert not unknown, f"{path.relative_to(ROOT)} names settings that config/ and the Procfile never read: {unknown}"


def test_the_settings_given_are_valid():
    """The ConfigMap, and compose's environment with the example env file, pass Settings
    (secrets aside: their placeholders refuse to parse, which the next test checks)."""
    urls = {k: secret()[k] for k in ("DATABASE_URL", "CELERY_BROKER_URL")}
    settings = Settings.from_env({**config_map(), **urls})
    assert settings.storage == "postgres" and settings.host == "0.0.0.0"
    services = compose()["services"]
    example = env_file()
    for name in procfile():
        env = {**not_secret(example), **{k: str(v) for k, v in (services[name].get("environment") or {}).items()}}
        settings = Settings.from_env(env)
        assert settings.storage == "postgres" and settings.database_url.startswith("postgresql"), name


def test_no_real_secrets_are_written_down():
    example = env_file(commented=True)
    for name, value in example.items():
        if SECRET_NAME.search(name):
            assert value == "" or PLACEHOLDER in value, f"whisperq.env.example: {name} must be an example ({PLACEHOLDER})"
    for name, value in secret().items():
        assert PLACEHOLDER in value, f"secret.example.yaml: {name} must be an example ({PLACEHOLDER})"
    for source in (example, secret()):
        for name, value in source.items():
            if "://" in value and "@" in value:  # a password inside a URL
                assert PLACEHOLDER in value.split("@", 1)[0], f"{name}: the URL's password must be an example"
    # The two URLs carry the same passwords as the servers are given.
    def password(url: str) -> str:
        return url.split("://", 1)[1].split("@", 1)[0].split(":", 1)[1]

    for source in (example, secret()):
        assert password(source["DATABASE_URL"]) == source["POSTGRES_PASSWORD"]
        assert password(source["CELERY_BROKER_URL"]) == source["REDIS_PASSWORD"]
    assert password(example["WHISPERQ_REDIS_URL"]) == example["REDIS_PASSWORD"]
    amqp = [v for v in (DEPLOY / "whisperq.env.example").read_text().split() if v.startswith("CELERY_BROKER_URL=amqp")]
    assert amqp and password(amqp[0].split("=", 1)[1]) == example["RABBITMQ_DEFAULT_PASS"]
    # Placeholders that would work as keys are refused at start instead.
    from config.keys import parse_keys
    from config.env import Env

    for source in (example, secret()):
        with pytest.raises(ValueError):
            parse_keys(source["WHISPERQ_ENCRYPTION_KEYS"])
        with pytest.raises(ConfigError):
            Env(source).webhook_secret("WHISPERQ_WEBHOOK_SECRET")
    # Nothing that looks like a real key anywhere, and no secret in compose.yaml itself.
    real_looking = re.compile(r"whsec_[A-Za-z0-9+/]{20,}|\bwq_[A-Za-z0-9_-]{16,}|[A-Za-z0-9_-]+:[A-Za-z0-9+/_-]{43}="
                              r"|-----BEGIN|://[^:/\s]*:(?!CHANGE-ME)[^@\s]+@")
    for path in [COMPOSE, ENV_EXAMPLE, DEPLOY / "Dockerfile", *sorted(K8S.glob("*.yaml"))]:
        found = real_looking.findall(path.read_text())
        assert not found, f"{path.relative_to(ROOT)} holds what looks like a real secret: {found}"
    for name, service in compose()["services"].items():
        for var in service.get("environment") or {}:
            assert not SECRET_NAME.search(var), f"compose.yaml sets {var} for {name}: secrets belong in whisperq.env"


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
    offsets = ast.literal_eval(re.search(r"^OFFSETS = (\{.*\})$", (ROOT / "tasks" / "metrics.py").read_text(),
                                         re.M).group(1))
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
    assert "FLOWER_BASIC_AUTH" in secret() and "FLOWER_BASIC_AUTH" in env_file()
    # Each Service selects pods that exist and names a port they have.
    pods = {d["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/component"]: d
            for kind in ("Deployment", "StatefulSet") for d in of_kind(kind).values()}
    for name, svc in of_kind("Service").items():
        component = svc["spec"]["selector"]["app.kubernetes.io/component"]
        assert component in pods, name
        named = {p["name"] for c in pods[component]["spec"]["template"]["spec"]["containers"] for p in c.get("ports", [])}
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
