"""``solar environment probe``: what this machine offers a run, without needing torch or a GPU.

Reads only: interpreter, torch/CUDA/NCCL when torch imports, GPUs through torch or ``nvidia-smi``,
other processes holding GPUs, the launcher-relevant environment (values of credential-looking
variables are redacted) and package versions.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import shutil
import subprocess
import sys
from typing import Any

ENV_PREFIXES = ("SOLAR_", "PET_", "TORCHELASTIC_", "NCCL_", "TORCH_", "CUDA_", "OMP_")
ENV_NAMES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK",
             "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "KUBECONFIG", "NVSHMEM_DISABLE_NVLS")
PACKAGES = ("solar-wm-ops", "torch", "numpy", "safetensors", "diffusers", "av", "pydantic", "PyYAML",
            "prometheus-client", "kopf", "kubernetes", "torchao")
_SECRET_WORDS = ("TOKEN", "PASSWORD", "SECRET", "API_KEY", "CREDENTIAL")


def _env(environ: dict[str, str]) -> dict[str, str]:
    shown = {}
    for name in sorted(environ):
        if name.startswith(ENV_PREFIXES) or name in ENV_NAMES:
            secret = any(word in name.upper() for word in _SECRET_WORDS)
            shown[name] = "<redacted>" if secret else environ[name]
    return shown


def _packages() -> dict[str, str | None]:
    versions: dict[str, str | None] = {}
    for name in PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def _torch_facts() -> dict[str, Any]:
    try:
        import torch  # noqa: PLC0415  (optional: the probe must work without it)
    except Exception as exc:  # ImportError, or a broken install
        return {"torch": {"available": False, "error": f"{type(exc).__name__}: {exc}"}}
    facts: dict[str, Any] = {"torch": {"available": True, "version": torch.__version__,
                                       "debug_build": bool(torch.version.debug)}}
    cuda_ok = torch.cuda.is_available()
    facts["cuda"] = {"available": cuda_ok, "version": torch.version.cuda,
                     "device_count": torch.cuda.device_count() if cuda_ok else 0}
    nccl = None
    if cuda_ok:
        try:
            nccl = ".".join(str(p) for p in torch.cuda.nccl.version())
        except Exception:  # NCCL missing from this build
            nccl = None
    facts["nccl"] = {"available": nccl is not None, "version": nccl}
    devices = []
    if cuda_ok:
        for index in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(index)
            devices.append({"index": index, "name": props.name, "memory_bytes": props.total_memory,
                            "capability": f"{props.major}.{props.minor}", "source": "torch"})
    facts["devices"] = devices
    facts["distributed"] = {"gloo": torch.distributed.is_gloo_available(),
                            "nccl": torch.distributed.is_nccl_available()}
    return facts


def _nvidia_smi(query: str, fields: str) -> list[list[str]] | None:
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        out = subprocess.run([exe, f"--query-{query}={fields}", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=20, check=True).stdout
    except (subprocess.SubprocessError, OSError):
        return None
    return [[cell.strip() for cell in line.split(",")] for line in out.splitlines() if line.strip()]


def local_gpu_memory_bytes() -> int | None:
    """The smallest memory of this machine's GPUs (``nvidia-smi``), or None without one; no torch."""
    rows = _nvidia_smi("gpu", "memory.total") or []
    sizes = [int(float(r[0])) << 20 for r in rows if r and r[0].replace(".", "", 1).isdigit()]
    return min(sizes) if sizes else None


def probe(environ: dict[str, str] | None = None) -> dict[str, Any]:
    environ = dict(os.environ if environ is None else environ)
    result: dict[str, Any] = {
        "schema": "solar.environment.v1",
        "python": {"version": platform.python_version(), "executable": sys.executable,
                   "implementation": platform.python_implementation()},
        "platform": {"system": platform.system(), "release": platform.release(),
                     "machine": platform.machine(), "cpu_count": os.cpu_count(),
                     "hostname": platform.node()},
    }
    result.update(_torch_facts())
    result.setdefault("cuda", {"available": False, "version": None, "device_count": 0})
    result.setdefault("nccl", {"available": False, "version": None})
    result.setdefault("devices", [])
    if not result["devices"]:
        rows = _nvidia_smi("gpu", "index,name,memory.total") or []
        result["devices"] = [{"index": int(r[0]), "name": r[1], "memory_bytes": int(float(r[2])) << 20,
                              "source": "nvidia-smi"} for r in rows if len(r) == 3]
    apps = _nvidia_smi("compute-apps", "pid,process_name,used_memory")
    result["gpu_processes"] = None if apps is None else [
        {"pid": int(r[0]), "name": r[1], "used_memory_bytes": int(float(r[2])) << 20}
        for r in apps if len(r) == 3 and r[0].isdigit()
    ]
    result["env"] = _env(environ)
    result["packages"] = _packages()
    return result
