"""Static checks of deploy/: files parse, the pieces are the expected ones, and every ``tuner`` or
``measure-agent`` command line in them (systemd ExecStart, Dockerfile CMD/ENTRYPOINT/HEALTHCHECK, compose
``command``, Kubernetes ``command``/``args``/probes, the README's shell examples) parses with the real
argparse parsers and names only real flags, spelled out. Units go through ``systemd-analyze verify``
when it is installed. The files are secure by default: every daemon, agent and client in them uses TLS
and tokens, secrets come from files (compose secrets, Kubernetes Secret volumes, systemd credentials)
and no password is written out. Nothing is built or started, except by the test of
``deploy/make-certs.sh``: it makes certificates and runs a daemon on loopback with them."""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re
import shlex
import shutil
import socket
import stat
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

yaml = pytest.importorskip("yaml", reason="PyYAML is needed to check deploy/ (pip install pyyaml)")

DEPLOY = Path(__file__).resolve().parent.parent / "deploy"
REPO = DEPLOY.parent
PROGRAMS = ("tuner", "measure-agent")
# Which Dockerfile an image name is built from (compose and Kubernetes `image:`, `docker run IMAGE`).
IMAGE_DOCKERFILES = {
    "tunefleet-daemon": "Dockerfile.daemon",
    "tunefleet-agent": "Dockerfile.agent",
    "tunefleet-agent-jetson": "Dockerfile.agent-jetson",
}
PLACEHOLDER = "placeholder"
CREDENTIALS_DIRECTORY = "/run/credentials/unit.service"
SYSTEMD_SPECIFIERS = {"i": "test-key", "I": "test-key", "H": "test-host", "n": "unit.service", "N": "unit",
                      "p": "unit", "u": "user", "h": "/home/user", "d": CREDENTIALS_DIRECTORY, "%": "%"}
SHELL_OPERATORS = ("&&", "||", "|", ";", "&", ">", ">>", "<", "2>")


@dataclass(frozen=True)
class Command:
    source: str
    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...] = ()  # the environment it runs with, where the file sets one (units)

    @property
    def program(self) -> str:
        return os.path.basename(self.argv[0])


# -- reading the files ---------------------------------------------------------------------------
def yaml_files(root: Path = DEPLOY) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.suffix in (".yaml", ".yml"))


def load_all(path: Path) -> list:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


def k8s_docs(root: Path = DEPLOY) -> list[tuple[Path, dict]]:
    return [(p, doc) for p in yaml_files(root) if "k8s" in p.relative_to(root).parts for doc in load_all(p)]


def compose(root: Path = DEPLOY) -> dict:
    return yaml.safe_load((root / "compose.yaml").read_text())


def logical_lines(path: Path, comments: str) -> list[str]:
    """Lines without blank and comment lines, backslash continuations joined."""
    out, pending = [], ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line[0] in comments):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        out.append(pending + line)
        pending = ""
    return out


def dockerfile_instructions(path: Path) -> list[tuple[str, str]]:
    out = []
    for line in logical_lines(path, "#"):
        instruction, _, value = line.partition(" ")
        out.append((instruction.upper(), value.strip()))
    return out


def dockerfile_exec(path: Path) -> dict[str, list[str]]:
    """ENTRYPOINT, CMD and HEALTHCHECK CMD (exec form) of a Dockerfile's last stage."""
    found: dict[str, list[str]] = {}
    for instruction, value in dockerfile_instructions(path):
        if instruction == "FROM":
            found = {}
        elif instruction in ("ENTRYPOINT", "CMD"):
            found[instruction] = json.loads(value)
        elif instruction == "HEALTHCHECK" and " CMD " in f" {value} ":
            found["HEALTHCHECK"] = json.loads(value[value.index("CMD ") + 4:])
    return found


def image_exec(image: str, root: Path = DEPLOY) -> dict[str, list[str]]:
    name = image.rsplit("/", 1)[-1].split(":")[0]
    return dockerfile_exec(root / IMAGE_DOCKERFILES[name]) if name in IMAGE_DOCKERFILES else {}


# -- structure ------------------------------------------------------------------------------------
def test_every_yaml_file_parses():
    files = yaml_files()
    assert DEPLOY / "compose.yaml" in files and len(files) >= 5
    for path in files:
        docs = load_all(path)
        assert docs, f"{path} is empty"
        assert all(isinstance(d, dict) for d in docs), f"{path}: every document must be a mapping"


def test_compose_services():
    services = compose()["services"]
    assert set(services) == {"daemon", "daemon-standby", "postgres", "agent-cpu", "prometheus"}
    assert services["postgres"]["image"].startswith("postgres:")
    assert services["daemon"]["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert services["daemon"]["command"][0] == "daemon"
    assert services["daemon"]["environment"]["TUNEFLEET_DB"].startswith("postgresql+psycopg://")
    assert services["daemon"]["build"]["dockerfile"] == "deploy/Dockerfile.daemon"
    # a leader and a standby on one PostgreSQL log (issue 22), and agents that know both
    standby = services["daemon-standby"]
    assert standby["image"] == services["daemon"]["image"] and standby["command"][0] == "daemon"
    assert standby["environment"]["TUNEFLEET_DB"] == services["daemon"]["environment"]["TUNEFLEET_DB"]
    for name in ("daemon", "daemon-standby"):
        command = services[name]["command"]
        assert command[command.index("--advertise") + 1] == f"{name}:9190"
    agent = services["agent-cpu"]["command"]
    assert agent[agent.index("--tracker") + 1] == "daemon:9190,daemon-standby:9190"
    assert services["agent-cpu"]["build"]["dockerfile"] == "deploy/Dockerfile.agent"
    for name, service in services.items():
        if "build" in service:
            context = (DEPLOY / service["build"]["context"]).resolve()
            assert (context / service["build"]["dockerfile"]).is_file(), name


def test_kubernetes_kinds():
    docs = k8s_docs()
    # No Secret manifests: kustomization.yaml's secretGenerator makes them from files (see the checks below).
    assert sorted(d["kind"] for _, d in docs) == sorted(
        ["Namespace", "Service", "StatefulSet", "Deployment", "Service", "DaemonSet", "Kustomization", "Job",
         "PodDisruptionBudget"])
    by_kind: dict[str, list[dict]] = {}
    for _, d in docs:
        assert d.get("apiVersion"), d["kind"]
        if d["kind"] != "Kustomization":
            assert d["metadata"]["name"], d["kind"]
        by_kind.setdefault(d["kind"], []).append(d)

    [postgres] = by_kind["StatefulSet"]
    assert postgres["spec"]["volumeClaimTemplates"], "PostgreSQL needs a persistent volume"
    pg_env = {e["name"]: e.get("value") for e in postgres["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert pg_env["POSTGRES_PASSWORD_FILE"] and "POSTGRES_PASSWORD" not in pg_env

    # A leader and a standby (issue 22): ready while leading, so the Service reaches the leader only; a
    # rollout that waited for a new (standby) pod to be ready would stall, so pods are replaced at once.
    [daemon] = by_kind["Deployment"]
    assert daemon["spec"]["replicas"] == 2
    assert daemon["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == "100%"
    container = daemon["spec"]["template"]["spec"]["containers"][0]
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    assert container["args"][container["args"].index("--advertise") + 1] == "$(POD_IP):9190"
    [budget] = by_kind["PodDisruptionBudget"]
    assert budget["spec"]["minAvailable"] == 1 and budget["spec"]["unhealthyPodEvictionPolicy"] == "AlwaysAllow"
    assert budget["spec"]["selector"]["matchLabels"] == daemon["spec"]["selector"]["matchLabels"]
    pod_labels = daemon["spec"]["template"]["metadata"]["labels"]
    daemon_service = next(s for s in by_kind["Service"] if s["metadata"]["name"] == "tunefleet-daemon")
    assert all(pod_labels.get(k) == v for k, v in daemon_service["spec"]["selector"].items())
    assert daemon_service["spec"]["ports"][0]["port"] == 9190

    [agents] = by_kind["DaemonSet"]
    pod = agents["spec"]["template"]["spec"]
    assert pod["nodeSelector"], "GPU agents must be pinned to their kind of node"
    assert int(pod["containers"][0]["resources"]["limits"]["nvidia.com/gpu"]) == 1
    assert all(agents["spec"]["template"]["metadata"]["labels"].get(k) == v
               for k, v in agents["spec"]["selector"]["matchLabels"].items())

    # The kustomization names every manifest next to it (jobs/ is applied by hand).
    [kustomization] = by_kind["Kustomization"]
    present = {p.name for p in (DEPLOY / "k8s").glob("*.yaml") if p.name != "kustomization.yaml"}
    assert set(kustomization["resources"]) == present


def test_dockerfiles_copy_what_exists():
    for name in IMAGE_DOCKERFILES.values():
        for instruction, value in dockerfile_instructions(DEPLOY / name):
            if instruction == "COPY" and "--from" not in value:
                *sources, _ = shlex.split(value)
                for source in sources:
                    assert (REPO / source).exists(), f"{name}: COPY {source}: no such path"
            if instruction in ("CMD", "ENTRYPOINT"):
                assert value.lstrip().startswith("["), f"{name}: {instruction} must use the exec (JSON) form"


# -- command lines in the files ------------------------------------------------------------------
def expand_shell(text: str, env: dict[str, str]) -> str:
    """``${VAR}``, ``${VAR:-default}``, ``$VAR`` from ``env``, else the default, else a placeholder."""

    def sub(match: re.Match) -> str:
        name = match.group("name") or match.group("bare")
        if name in env:
            return env[name]
        return match.group("default") if match.group("default") is not None else PLACEHOLDER

    return re.sub(r"\$\{(?P<name>\w+)(?::?-(?P<default>[^}]*))?\}|\$(?P<bare>\w+)", sub, text)


def expand_k8s(text: str, env: dict[str, str]) -> str:
    """Kubernetes ``$(VAR)`` from the container's env (values from Secrets or fields: a placeholder)."""
    return re.sub(r"\$\((\w+)\)", lambda m: env.get(m.group(1), PLACEHOLDER), text)


def parse_env_file(path: Path) -> dict[str, str]:
    env = {}
    for line in logical_lines(path, "#"):
        key, _, value = line.partition("=")
        env[key.strip()] = value.strip().strip('"')
    return env


def systemd_specifiers(text: str) -> str:
    return re.sub(r"%(.)", lambda m: SYSTEMD_SPECIFIERS.get(m.group(1), PLACEHOLDER), text)


def unit_commands(root: Path = DEPLOY) -> list[Command]:
    """Exec lines of the units, variables from the units' Environment= and then from the example env files."""
    commands = []
    for unit in sorted((root / "systemd").glob("*.service")):
        settings = [(k.strip(), v.strip()) for k, _, v in
                    (line.partition("=") for line in logical_lines(unit, "#;") if not line.startswith("["))]
        defaults: dict[str, str] = {}
        examples: dict[str, str] = {}
        for key, value in settings:
            if key == "Environment":
                for assignment in shlex.split(value):
                    name, _, val = assignment.partition("=")
                    defaults[name] = systemd_specifiers(val)
            elif key == "EnvironmentFile":
                example = root / "systemd" / (Path(value.lstrip("-")).name + ".example")
                if example.is_file():
                    examples.update(parse_env_file(example))
        for key, value in settings:
            if key.startswith("Exec"):
                line = systemd_specifiers(value.lstrip("-@:+!"))
                for label, env in (("defaults", defaults), ("example env files", {**defaults, **examples})):
                    argv = tuple(shlex.split(expand_shell(line, env)))
                    commands.append(Command(f"{unit.name} {key} ({label})", argv, tuple(sorted(env.items()))))
    return commands


def dockerfile_commands(root: Path = DEPLOY) -> list[Command]:
    commands = []
    for name in IMAGE_DOCKERFILES.values():
        found = dockerfile_exec(root / name)
        commands.append(Command(f"{name} ENTRYPOINT+CMD", tuple(found.get("ENTRYPOINT", []) + found.get("CMD", []))))
        if "HEALTHCHECK" in found:
            commands.append(Command(f"{name} HEALTHCHECK", tuple(found["HEALTHCHECK"])))
    return commands


def as_list(value) -> list[str]:
    return shlex.split(value) if isinstance(value, str) else [str(v) for v in value]


def compose_commands(root: Path = DEPLOY) -> list[Command]:
    commands = []
    for name, service in compose(root)["services"].items():
        if "build" in service:
            image = dockerfile_exec((root / service["build"]["context"] / service["build"]["dockerfile"]).resolve())
        else:
            image = image_exec(service.get("image", ""), root)
        entrypoint = as_list(service["entrypoint"]) if "entrypoint" in service else image.get("ENTRYPOINT", [])
        command = as_list(service["command"]) if "command" in service else image.get("CMD", [])
        argv = tuple(expand_shell(a, {}).replace("$$", "$") for a in entrypoint + command)
        if argv:
            commands.append(Command(f"compose.yaml {name}", argv))
        test = service.get("healthcheck", {}).get("test")
        if isinstance(test, list) and test and test[0] == "CMD":
            commands.append(Command(f"compose.yaml {name} healthcheck", tuple(as_list(test[1:]))))
    return commands


def k8s_commands(root: Path = DEPLOY) -> list[Command]:
    commands = []
    for path, doc in k8s_docs(root):
        spec = doc.get("spec", {})
        pod = spec.get("template", {}).get("spec") or \
            spec.get("jobTemplate", {}).get("spec", {}).get("template", {}).get("spec")
        if not pod:
            continue
        for container in pod.get("initContainers", []) + pod.get("containers", []):
            env = {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}
            image = image_exec(container["image"], root)
            command = container.get("command") or image.get("ENTRYPOINT", [])
            if "args" in container:
                args = container["args"]
            else:
                args = [] if "command" in container else image.get("CMD", [])
            where = f"{path.relative_to(root)} {doc['kind']}/{doc['metadata']['name']} {container['name']}"
            commands.append(Command(where, tuple(expand_k8s(str(a), env) for a in command + args)))
            for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
                exec_command = container.get(probe, {}).get("exec", {}).get("command")
                if exec_command:
                    commands.append(Command(f"{where} {probe}", tuple(expand_k8s(str(a), env) for a in exec_command)))
    return commands


def invocations(line: str, root: Path = DEPLOY) -> list[tuple[str, ...]]:
    """``tuner``/``measure-agent`` command lines in a shell line, including ``docker run ... IMAGE ARGS``
    (with the image's entrypoint)."""
    lexer = shlex.shlex(expand_shell(line, {}), posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    tokens = list(lexer)
    found = []
    for i, token in enumerate(tokens):
        if os.path.basename(token) in PROGRAMS:
            argv, start = [], i
        elif tokens[:2] == ["docker", "run"] and i > 1 and token.split(":")[0] in IMAGE_DOCKERFILES:
            argv, start = list(image_exec(token, root).get("ENTRYPOINT", [])), i + 1
        else:
            continue
        for t in tokens[start:]:
            if t in SHELL_OPERATORS:
                break
            argv.append(t)
        if argv and os.path.basename(argv[0]) in PROGRAMS:
            found.append(tuple(argv))
    return found


def readme_commands(root: Path = DEPLOY) -> list[Command]:
    """Command lines in the README's fenced shell blocks (parsed in full)."""
    commands = []
    for block in re.findall(r"```(?:bash|sh)\n(.*?)```", (root / "README.md").read_text(), flags=re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = " ".join(line.split(" #", 1)[0].split())
            if line and not line.startswith("#"):
                commands += [Command(f"README.md: {line}", argv) for argv in invocations(line, root)]
    return commands


def readme_inline_commands(root: Path = DEPLOY) -> list[Command]:
    """Command lines in the README's inline code spans: synopses with placeholders (HOST:PORT,
    [--db URL]), so only their flags are checked."""
    text = re.sub(r"```.*?```", "", (root / "README.md").read_text(), flags=re.S)
    commands = []
    for span in re.findall(r"`([^`]+)`", text.replace("\n", " ")):
        span = " ".join(span.replace("[", " ").replace("]", " ").replace("...", " ").split())
        commands += [Command(f"README.md inline: {span}", argv) for argv in invocations(span, root)
                     if len(argv) > 1]
    return commands


def fleet_commands(root: Path = DEPLOY) -> list[Command]:
    found = (unit_commands(root) + dockerfile_commands(root) + compose_commands(root) + k8s_commands(root)
             + readme_commands(root))
    return [c for c in found if c.argv and c.program in PROGRAMS]


# -- checking a command line -----------------------------------------------------------------------
def parser_for(program: str) -> argparse.ArgumentParser:
    if program == "tuner":
        from tuner.cli import build_parser
    else:
        from measure_agent.cli import build_parser
    return build_parser()


def option_strings(parser: argparse.ArgumentParser, args: list[str]) -> set[str]:
    """Every option string of ``parser`` and of the subcommands ``args`` select, recursively."""
    names: set[str] = set()
    for action in parser._actions:
        names.update(action.option_strings)
        if isinstance(action, argparse._SubParsersAction):
            for i, token in enumerate(args):
                if token in action.choices:
                    names |= option_strings(action.choices[token], args[i + 1:])
                    break
    return names


def check_flags(argv: list[str]) -> None:
    """Every flag in ``argv`` is one of the selected (sub)commands' flags, spelled out (argparse would
    accept an abbreviation, which breaks as soon as another flag shares the prefix)."""
    program, args = os.path.basename(argv[0]), list(argv[1:])
    known = option_strings(parser_for(program), args)
    for token in args:
        if token.startswith("-") and token != "-" and not re.fullmatch(r"-\d.*", token):
            flag = token.split("=", 1)[0]
            assert flag in known, f"{' '.join(argv)}: {flag} is not a {program} flag (abbreviated?)"


def check_command(argv: list[str], env: dict[str, str] | None = None) -> argparse.Namespace:
    """Parse ``argv`` (program first) with the real parser and fill an agent's flags from ``env``
    (its TUNEFLEET_* settings; no config file), as measure-agent does; raise AssertionError naming the problem."""
    from measure_agent.settings import Settings, SettingsError, apply

    program, args = os.path.basename(argv[0]), list(argv[1:])
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
            namespace = parser_for(program).parse_args(args)
    except SystemExit:
        message = (stderr.getvalue().strip().splitlines() or ["(no message)"])[-1]
        raise AssertionError(f"{' '.join(argv)}: rejected by {program}'s parser: {message}") from None
    check_flags(argv)
    if program == "measure-agent" and namespace.command is None:
        no_file = {"XDG_CONFIG_HOME": str(REPO / "no-such-config-dir")}
        try:
            apply(namespace, Settings("agent", environ={**(env or {}), **no_file}))
        except SettingsError as exc:
            raise AssertionError(f"{' '.join(argv)}: bad settings in its environment: {exc}") from None
    if program == "measure-agent" and namespace.command is None:
        assert namespace.tracker and namespace.key, f"{' '.join(argv)}: an agent needs --tracker and --key"
        assert namespace.parallel >= 1, f"{' '.join(argv)}: --parallel must be >= 1"
    return namespace


COMMANDS = fleet_commands()
INLINE = readme_inline_commands()


@pytest.mark.parametrize("command", COMMANDS, ids=[c.source for c in COMMANDS])
def test_command_lines_use_real_subcommands_and_flags(command):
    check_command(list(command.argv), dict(command.env))


@pytest.mark.parametrize("command", INLINE, ids=[c.source for c in INLINE])
def test_readme_synopses_name_real_flags(command):
    check_flags(list(command.argv))


def test_every_kind_of_deploy_file_was_checked():
    """The extraction found what it should (an empty list would pass vacuously)."""
    seen = {(c.source.split()[0], c.program, c.argv[1] if len(c.argv) > 1 else "") for c in COMMANDS}
    expected = {
        ("tunefleet-daemon.service", "tuner", "daemon"),
        ("tunefleet-agent@.service", "measure-agent", "--key"),
        ("Dockerfile.daemon", "tuner", "daemon"),
        ("Dockerfile.daemon", "tuner", "agents"),
        ("Dockerfile.agent", "measure-agent", "info"),
        ("Dockerfile.agent-jetson", "measure-agent", "info"),
        ("compose.yaml", "tuner", "daemon"),
        ("compose.yaml", "measure-agent", "--tracker"),
        ("k8s/daemon.yaml", "tuner", "daemon"),
        ("k8s/daemon.yaml", "tuner", "agents"),
        ("k8s/agents-gpu.yaml", "measure-agent", "--tracker"),
        ("k8s/jobs/db-upgrade.yaml", "tuner", "db"),
        ("README.md:", "tuner", "agents"),
    }
    assert expected <= seen, sorted(expected - seen)
    assert len(INLINE) >= 3
    # Variables were resolved: the agent's key is the unit's instance name.
    assert any("test-key" in c.argv for c in COMMANDS if c.source.startswith("tunefleet-agent@"))


@pytest.mark.parametrize("argv, problem", [
    (["tuner", "daemon", "--no-such-flag", "1"], "rejected"),
    (["tuner", "daemon", "--agent-timeout", "zero"], "rejected"),
    (["tuner", "no-such-command"], "rejected"),
    (["tuner", "daemon", "--list", "0.0.0.0:9190"], "abbreviated"),
    (["measure-agent", "--tracker", "h:9190"], "needs --tracker and --key"),
    (["measure-agent", "--tracker", "h:9190", "--key", "k", "--parallel", "x"], "rejected"),
    (["measure-agent", "--key", "k"], "needs --tracker and --key"),
])
def test_the_checker_rejects_bad_command_lines(argv, problem):
    with pytest.raises(AssertionError, match=problem):
        check_command(argv)


def test_the_checker_fills_an_agent_from_its_environment():
    namespace = check_command(["measure-agent", "--key", "k"], {"TUNEFLEET_TRACKER": "h:9190",
                                                                "TUNEFLEET_AGENT_PARALLEL": "3"})
    assert (namespace.tracker, namespace.parallel) == ("h:9190", 3)
    with pytest.raises(AssertionError, match="bad settings.*TUNEFLEET_AGENT_PARALLEL"):
        check_command(["measure-agent", "--key", "k"], {"TUNEFLEET_TRACKER": "h:9190", "TUNEFLEET_AGENT_PARALLEL": "0"})


def test_agent_unit_does_not_restart_an_agent_the_daemon_refused():
    """An agent refused for its version exits with EXIT_REFUSED; systemd must not restart it (it would be
    refused again, forever), while other failures are still restarted."""
    from measure_agent.cli import EXIT_REFUSED

    settings = dict(line.partition("=")[::2] for line in logical_lines(DEPLOY / "systemd" / "tunefleet-agent@.service", "#;")
                    if "=" in line and not line.startswith("["))
    assert settings["Restart"] == "on-failure"
    assert settings["RestartPreventExitStatus"].split() == [str(EXIT_REFUSED)]
    assert str(EXIT_REFUSED) in (DEPLOY / "README.md").read_text()


# -- secure by default -----------------------------------------------------------------------------
DAEMON_SECURITY = ("tls_cert", "tls_key", "agent_token_file", "client_token_file")
AGENT_SECURITY = ("token_file", "tls_ca")
CLIENT_SECURITY = ("token_file", "tls_ca")


def deployed_commands() -> list[Command]:
    """The command lines of the deploy files and the README's shell blocks that run or reach a daemon."""
    return [c for c in COMMANDS if (c.program, c.argv[1]) == ("tuner", "daemon") or "--tracker" in c.argv
            or c.program == "measure-agent" and "--key" in c.argv]


def test_every_daemon_agent_and_client_uses_tls_and_tokens():
    from tuner.daemon.security import exposure_policy

    checked = set()
    for command in deployed_commands():
        namespace = check_command(list(command.argv), dict(command.env))
        if command.program == "tuner" and command.argv[1] == "daemon":
            missing = [flag for flag in DAEMON_SECURITY if not getattr(namespace, flag)]
            assert not missing, f"{command.source}: a daemon without {missing}"
            assert not namespace.insecure, f"{command.source}: --insecure"
            assert namespace.metrics_listen, f"{command.source}: metrics off"
            # What the daemon itself decides for these arguments: start, and warn of nothing.
            assert exposure_policy(namespace.listen, agent_tokens=bool(namespace.agent_token_file),
                                   client_tokens=bool(namespace.client_token_file), tls=bool(namespace.tls_cert),
                                   insecure=namespace.insecure) == (None, []), command.source
            checked.add("daemon")
        else:
            flags = AGENT_SECURITY if command.program == "measure-agent" else CLIENT_SECURITY
            missing = [flag for flag in flags if not getattr(namespace, flag)]
            assert not missing, f"{command.source}: {command.program} reaches the daemon without {missing}"
            checked.add(command.program)
    assert checked == {"daemon", "measure-agent", "tuner"}
    sources = {c.source.split()[0] for c in deployed_commands()}
    assert {"tunefleet-daemon.service", "tunefleet-agent@.service", "Dockerfile.daemon", "compose.yaml",
            "k8s/daemon.yaml", "k8s/agents-gpu.yaml", "README.md:"} <= sources


def deploy_texts() -> dict[Path, str]:
    return {p: p.read_text() for p in sorted(DEPLOY.rglob("*")) if p.is_file() and p.suffix != ".pyc"}


def test_no_insecure_flag_and_nothing_left_commented_out():
    """Security settings are live, not examples waiting to be uncommented."""
    commented_settings = re.compile(r"^\s*#\s*-\s+--[\w-]+\s*$"               # a YAML list item of a flag
                                    r"|^#\s*ExecStart="                           # an alternative unit command
                                    r"|^#\s*(CMD|ENTRYPOINT|HEALTHCHECK)\s+\[")   # an alternative image command
    for path, text in deploy_texts().items():
        assert "--insecure" not in text, f"{path}: --insecure"
        assert "Coming with issue" not in text, path
        for line in text.splitlines():
            assert not commented_settings.search(line), f"{path}: {line.strip()}"


def test_no_password_in_any_file():
    for path, text in deploy_texts().items():
        # user:password@ in a URL, or a password given inline
        assert not re.search(r"://[^/\s:@]+:[^@\s/]+@", text), f"{path}: a URL with a password"
        assert not re.search(r"--from-literal|stringData|POSTGRES_PASSWORD\s*[:=]", text), f"{path}: an inline secret"
    env = {k: v for s in compose()["services"].values() for k, v in s.get("environment", {}).items()}
    for name, value in env.items():
        assert not re.search("PASSWORD|TOKEN|SECRET", name) or value.startswith("/run/secrets/"), name
    for path, doc in k8s_docs():
        assert doc["kind"] != "Secret", f"{path}: a Secret with its value in the manifest"
        for container in pod_spec(doc).get("containers", []):
            for e in container.get("env", []):
                assert "secretKeyRef" not in e.get("valueFrom", {}), f"{path}: {e['name']} from a Secret: mount it"
                if re.search("PASSWORD|TOKEN|SECRET", e["name"]):
                    assert e["name"].endswith("_FILE") and e["value"].startswith("/"), f"{path}: {e['name']}"
    for path in (DEPLOY / "systemd").glob("*"):
        for line in path.read_text().splitlines():
            setting = re.match(r"#?\s*(?:Environment=)?(\w+)=", line)
            if setting and re.search("PASSWORD|TOKEN|SECRET", setting.group(1)):
                assert setting.group(1).endswith("_FILE"), f"{path}: {line}"


def test_compose_secrets_are_files_mounted_where_the_commands_read_them():
    spec = compose()
    defined = spec["secrets"]
    for name, secret in defined.items():
        assert set(secret) == {"file"}, f"secret {name}: from a file only"
        assert secret["file"].startswith("./secrets/"), f"secret {name}: under deploy/secrets (not in git)"
    for name, service in spec["services"].items():
        mounted = {s if isinstance(s, str) else s["source"] for s in service.get("secrets", [])}
        assert mounted <= set(defined), name
        text = json.dumps({k: service.get(k) for k in ("command", "healthcheck", "environment")})
        used = set(re.findall(r"/run/secrets/([\w.-]+)", text))
        assert used <= mounted, f"{name} reads secrets it does not mount: {sorted(used - mounted)}"
    assert (DEPLOY / ".gitignore").read_text().count("/secrets/") >= 2
    metrics = spec["services"]["daemon"]["command"]
    metrics_port = metrics[metrics.index("--metrics-listen") + 1].rsplit(":", 1)[1]
    [prometheus_config] = [c for c in spec["services"]["prometheus"]["configs"]]
    scrape = yaml.safe_load((DEPLOY / spec["configs"][prometheus_config["source"]]["file"]).read_text())
    targets = [t for job in scrape["scrape_configs"] for sc in job["static_configs"] for t in sc["targets"]]
    assert f"daemon:{metrics_port}" in targets


def pod_spec(doc: dict) -> dict:
    spec = doc.get("spec", {})
    return spec.get("template", {}).get("spec") or \
        spec.get("jobTemplate", {}).get("spec", {}).get("template", {}).get("spec") or {}


def generated_secrets() -> dict[str, set[str]]:
    """Secret name -> its keys, from kustomization.yaml's secretGenerator (each file must be under secrets/)."""
    kustomization = yaml.safe_load((DEPLOY / "k8s" / "kustomization.yaml").read_text())
    secrets = {}
    for generator in kustomization["secretGenerator"]:
        assert set(generator) <= {"name", "type", "files"}, f"{generator['name']}: from files only (no literals)"
        keys = set()
        for entry in generator["files"]:
            key, _, path = entry.rpartition("=")
            path = path or entry
            assert path.startswith("secrets/"), f"{generator['name']}: {path} outside deploy/k8s/secrets (not in git)"
            keys.add(key or Path(path).name)
        secrets[generator["name"]] = keys
    return secrets


def mounted_files(pod: dict, container: dict) -> dict[str, str]:
    """Path of each file a container gets from a Secret -> the Secret's name."""
    volumes = {v["name"]: v for v in pod.get("volumes", [])}
    files = {}
    for mount in container.get("volumeMounts", []):
        volume = volumes.get(mount["name"], {})  # not there: a StatefulSet's volumeClaimTemplates
        if not {"secret", "projected"} & set(volume):
            continue
        sources = [volume["secret"]] if "secret" in volume else \
            [s["secret"] for s in volume.get("projected", {}).get("sources", []) if "secret" in s]
        for source in sources:
            name = source.get("secretName") or source["name"]
            keys = {i["path"]: i["key"] for i in source["items"]} if "items" in source else \
                {k: k for k in generated_secrets().get(name, ())}
            for path, key in keys.items():
                assert key in generated_secrets().get(name, ()), f"{name} has no key {key}"
                files[f"{mount['mountPath']}/{path}"] = name
            # Readable by the pod's fsGroup only.
            mode = volume.get("secret", volume.get("projected", {})).get("defaultMode")
            assert mode is not None and mode & 0o007 == 0, f"volume {mount['name']}: world-readable secret files"
    return files


def test_kubernetes_secrets_are_mounted_files_for_every_path_the_containers_read():
    generated = generated_secrets()
    assert {"tunefleet-daemon-tls", "tunefleet-ca", "tunefleet-agent-token", "tunefleet-client-token",
            "tunefleet-postgres"} <= set(generated)
    seen = 0
    for path, doc in k8s_docs():
        pod = pod_spec(doc)
        for container in pod.get("containers", []):
            files = mounted_files(pod, container)
            if files:
                assert pod["securityContext"].get("fsGroup"), f"{path}: secret files need the pod's fsGroup"
            text = json.dumps({k: container.get(k) for k in ("command", "args", "env", "livenessProbe")})
            for used in re.findall(r"(/(?:etc|run)/[\w/.-]*secrets[\w/.-]*)", text):
                assert used in files, f"{path} {container['name']}: {used} is not a mounted Secret file"
                seen += 1
    assert seen >= 10
    # The agents get the CA and their token, never the daemon's key or the client token.
    [agents] = [d for _, d in k8s_docs() if d["kind"] == "DaemonSet"]
    agent_files = mounted_files(pod_spec(agents), pod_spec(agents)["containers"][0])
    assert set(agent_files.values()) == {"tunefleet-ca", "tunefleet-agent-token"}


def test_daemon_pod_is_scraped_for_metrics():
    [daemon] = [d for _, d in k8s_docs() if d["kind"] == "Deployment"]
    annotations = daemon["spec"]["template"]["metadata"]["annotations"]
    container = pod_spec(daemon)["containers"][0]
    metrics = container["args"][container["args"].index("--metrics-listen") + 1]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/port"] == metrics.rsplit(":", 1)[1]
    assert any(p["name"] == "metrics" for p in container["ports"])


def test_units_load_every_credential_they_read():
    for unit in sorted((DEPLOY / "systemd").glob("*.service")):
        text = unit.read_text()
        live = set(re.findall(r"^LoadCredential=([\w.-]+):/", text, flags=re.M))
        optional = set(re.findall(r"^#LoadCredential=([\w.-]+):/", text, flags=re.M))
        exec_lines = "\n".join(re.findall(r"^Exec\w+=.*$", text, flags=re.M))
        in_exec = set(re.findall(r"\$\{CREDENTIALS_DIRECTORY\}/([\w.-]+)", exec_lines))
        in_environment = set(re.findall(r"^Environment=\w+=%d/([\w.-]+)", text, flags=re.M))
        assert in_exec, unit.name
        assert in_exec <= live, f"{unit.name}: ExecStart reads credentials it does not load: {in_exec - live}"
        assert in_environment <= live | optional, unit.name


@pytest.mark.timeout(180)
@pytest.mark.skipif(shutil.which("openssl") is None, reason="openssl is not installed (make-certs.sh needs it)")
def test_make_certs_makes_what_a_daemon_and_its_clients_need(tmp_path, cli_env):
    """deploy/make-certs.sh into tmp_path, then a daemon with those files on 127.0.0.1 (TLS, tokens and
    client certificates) and clients that connect with the CA, or are refused without it."""
    out = tmp_path / "secrets"
    make = [str(DEPLOY / "make-certs.sh"), "-o", str(out), "--client", "agent-1", "--tokens",
            "tuner.example.internal", "10.1.2.3"]
    made = subprocess.run(make, capture_output=True, text=True, timeout=60)
    assert made.returncode == 0, made.stderr
    for name in ("ca.key", "daemon.key", "agent-1.key", "agent-token", "client-token"):
        assert stat.S_IMODE((out / name).stat().st_mode) == 0o600, name
    assert stat.S_IMODE(out.stat().st_mode) == 0o700
    sans = subprocess.run(["openssl", "x509", "-in", str(out / "daemon.crt"), "-noout", "-text"],
                          capture_output=True, text=True, check=True).stdout
    for san in ("DNS:tuner.example.internal", "IP Address:10.1.2.3", "DNS:localhost", "IP Address:127.0.0.1"):
        assert san in sans
    for cert in ("daemon.crt", "agent-1.crt"):
        subprocess.run(["openssl", "verify", "-CAfile", str(out / "ca.crt"), str(out / cert)], check=True,
                       capture_output=True)

    # A second run (another client) keeps the CA and the tokens: what is deployed stays valid.
    ca, token = (out / "ca.crt").read_bytes(), (out / "agent-token").read_text()
    subprocess.run(make[:3] + ["--client", "agent-2", "--tokens", "localhost"], check=True, capture_output=True,
                   timeout=60)
    assert (out / "ca.crt").read_bytes() == ca and (out / "agent-token").read_text() == token
    subprocess.run(["openssl", "verify", "-CAfile", str(out / "ca.crt"), str(out / "agent-1.crt")], check=True,
                   capture_output=True)

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    daemon = subprocess.Popen(
        [sys.executable, "-m", "tuner", "daemon", "--listen", f"127.0.0.1:{port}", "--templates", "testing",
         "--db", f"sqlite:///{tmp_path / 'tls.db'}", "--tls-cert", str(out / "daemon.crt"),
         "--tls-key", str(out / "daemon.key"), "--tls-client-ca", str(out / "ca.crt"),
         "--agent-token-file", str(out / "agent-token"), "--client-token-file", str(out / "client-token")],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=cli_env)
    try:
        assert f"listening on 127.0.0.1:{port}" in daemon.stdout.readline()

        def agents(host, *credentials):
            return subprocess.run([sys.executable, "-m", "tuner", "agents", "--tracker", f"{host}:{port}",
                                   *credentials], capture_output=True, text=True, env=cli_env, timeout=60)

        client = ("--tls-cert", str(out / "agent-2.crt"), "--tls-key", str(out / "agent-2.key"))
        trusted = ("--tls-ca", str(out / "ca.crt"), "--token-file", str(out / "client-token"))
        for host in ("127.0.0.1", "localhost"):
            ok = agents(host, *trusted, *client)
            assert ok.returncode == 0, ok.stderr
        wrong_token = agents("127.0.0.1", "--tls-ca", str(out / "ca.crt"), "--token-file", str(out / "agent-token"),
                             *client)
        assert wrong_token.returncode == 1
        assert wrong_token.stderr.strip() == "tuner: error: the daemon refused the client token (missing or wrong)"

        # TLS refusals in-process with a short deadline (the CLI would wait out its default timeout).
        from measure_agent.protocol.connection import TlsFiles
        from measure_agent.protocol.errors import FleetError
        from tuner.daemon import FleetClient

        token = (out / "client-token").read_text().strip()
        address = f"127.0.0.1:{port}"
        no_client_certificate = TlsFiles(ca=str(out / "ca.crt"))
        daemon_not_trusted = TlsFiles(cert=str(out / "agent-2.crt"), key=str(out / "agent-2.key"))
        for tls in (no_client_certificate, daemon_not_trusted):
            with FleetClient(address, timeout_s=3, token=token, tls=tls) as refused:
                with pytest.raises(FleetError):  # the handshake fails: unreachable, as far as the client knows
                    refused.agents()
    finally:
        daemon.terminate()
        _, err = daemon.communicate(timeout=30)
    # TLS and tokens: nothing to warn about but the refused token above
    assert [line for line in err.splitlines() if "WARNING" in line and "refused" not in line] == [], err


# -- systemd --------------------------------------------------------------------------------------
@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_units_pass_systemd_analyze_verify(tmp_path):
    # verify checks that ExecStart's program exists: point the units at stand-ins, change nothing else.
    stub_dir = tmp_path / "bin"
    stub_dir.mkdir()
    units = []
    for unit in sorted((DEPLOY / "systemd").glob("*.service")):
        text = unit.read_text()
        for program in set(re.findall(r"^#?Exec\w+=[-@:+!]*(/\S+)", text, flags=re.M)):
            stub = stub_dir / Path(program).name
            stub.write_text("#!/bin/sh\nexit 0\n")
            stub.chmod(0o755)
            text = text.replace(program, str(stub))
        copy = tmp_path / unit.name
        copy.write_text(text)
        units.append(str(copy))
    assert len(units) == 2
    proc = subprocess.run(["systemd-analyze", "verify", "--man=no", *units], capture_output=True, text=True,
                          timeout=60)
    # verify reports problems (unknown keys, bad values) as warnings without always failing: none allowed.
    assert proc.returncode == 0 and not proc.stderr.strip(), proc.stderr
