"""From a pod's container spec to a local process: image, command, environment, volumes.

What a container runtime would do with namespaces, the stand-in does with rewriting, so the
operator's rendered command, args and env run unchanged in meaning:

- **image → program**: the image table (:mod:`.images`); ``command`` replaces the entrypoint,
  ``args`` follow, ``$(VAR)`` references are expanded from the container's env as a kubelet does;
- **env**: ``value``, ``valueFrom`` (``secretKeyRef``, ``configMapKeyRef``, ``fieldRef`` for
  the pod's name, namespace, IP and node) and ``envFrom``, read from the API when the container
  starts; a missing Secret, ConfigMap or key is ``CreateContainerConfigError``, as on a node;
- **volumes**: each volume is a directory of the pod's own (``emptyDir``; ``secret`` and
  ``configMap`` written out key by key); a word of the command, args or env that is a mount path
  or lies under one (``/models/x.gguf``, ``--model=/models/x.gguf``) is rewritten to the
  directory, since the process sees the host's filesystem;
- **network**: the pod's own address: a word ``0.0.0.0`` (``--host 0.0.0.0``, which the operator
  renders so the engine listens on the pod's interface) becomes the pod IP, so every pod can
  listen on the same port, as pods in their own network namespaces do.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .images import Image

__all__ = ["ConfigError", "Launch", "PodContext", "launch", "volume_dirs"]

Obj = Mapping[str, Any]
Fetch = Callable[[str], Obj | None]
"""GET an API path; ``None`` for 404."""
_REFERENCE = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


class ConfigError(Exception):
    """The container cannot be built: CreateContainerConfigError with this message."""


@dataclass(frozen=True)
class PodContext:
    """What every container of one pod shares."""

    namespace: str
    name: str
    ip: str
    node: str
    root: Path
    """The pod's directory: volumes, logs, working directory."""


@dataclass(frozen=True)
class Launch:
    argv: list[str]
    env: dict[str, str]
    cwd: Path


def _secret(fetch: Fetch, pod: PodContext, name: str) -> dict[str, str]:
    found = fetch(f"/api/v1/namespaces/{pod.namespace}/secrets/{name}")
    if found is None:
        raise ConfigError(f'secret "{name}" not found')
    data = found.get("data") or {}
    return {k: base64.b64decode(v).decode() for k, v in data.items()}


def _config_map(fetch: Fetch, pod: PodContext, name: str) -> dict[str, str]:
    found = fetch(f"/api/v1/namespaces/{pod.namespace}/configmaps/{name}")
    if found is None:
        raise ConfigError(f'configmap "{name}" not found')
    return dict(found.get("data") or {})


def _field(pod: PodContext, path: str) -> str:
    fields = {
        "metadata.name": pod.name,
        "metadata.namespace": pod.namespace,
        "status.podIP": pod.ip,
        "spec.nodeName": pod.node,
    }
    if path not in fields:
        raise ConfigError(f"fieldRef {path} is not supported by the kubelet stand-in")
    return fields[path]


def _value_from(source: Obj, fetch: Fetch, pod: PodContext) -> str | None:
    for kind, read in (("secretKeyRef", _secret), ("configMapKeyRef", _config_map)):
        ref = source.get(kind)
        if ref is None:
            continue
        values = read(fetch, pod, ref["name"])
        if ref["key"] not in values:
            if ref.get("optional"):
                return None
            what = "Secret" if kind == "secretKeyRef" else "ConfigMap"
            raise ConfigError(
                f"couldn't find key {ref['key']} in {what} {pod.namespace}/{ref['name']}"
            )
        return values[ref["key"]]
    if "fieldRef" in source:
        return _field(pod, source["fieldRef"]["fieldPath"])
    raise ConfigError(f"valueFrom {sorted(source)} is not supported by the kubelet stand-in")


def _environment(container: Obj, fetch: Fetch, pod: PodContext) -> dict[str, str]:
    env: dict[str, str] = {}
    for source in container.get("envFrom") or []:
        if "secretRef" in source:
            env |= _secret(fetch, pod, source["secretRef"]["name"])
        elif "configMapRef" in source:
            env |= _config_map(fetch, pod, source["configMapRef"]["name"])
    for var in container.get("env") or []:
        if "valueFrom" in var:
            value = _value_from(var["valueFrom"], fetch, pod)
            if value is not None:
                env[var["name"]] = value
        else:
            env[var["name"]] = _expand(var.get("value", ""), env)
    return env


def _expand(text: str, env: Mapping[str, str]) -> str:
    """``$(VAR)`` as the kubelet expands it in command, args and env values."""
    return _REFERENCE.sub(lambda m: env.get(m.group(1), m.group(0)), text)


def volume_dirs(pod: Obj, root: Path, fetch: Fetch, context: PodContext) -> dict[str, Path]:
    """One directory per volume, filled for ``secret`` and ``configMap`` volumes."""
    dirs: dict[str, Path] = {}
    for volume in pod["spec"].get("volumes") or []:
        path = root / "volumes" / volume["name"]
        path.mkdir(parents=True, exist_ok=True)
        if "secret" in volume:
            files = _secret(fetch, context, volume["secret"]["secretName"])
        elif "configMap" in volume:
            files = _config_map(fetch, context, volume["configMap"]["name"])
        elif "emptyDir" in volume:
            files = {}
        else:
            raise ConfigError(  # e.g. a projected service-account token: not needed so far
                f"volume {volume['name']}: the kubelet stand-in runs only emptyDir, secret and "
                "configMap volumes"
            )
        for key, text in files.items():
            (path / key).write_text(text)
        dirs[volume["name"]] = path
    return dirs


def _rewriter(container: Obj, dirs: Mapping[str, Path], ip: str) -> Callable[[str], str]:
    mounts = sorted(
        (
            (m["mountPath"].rstrip("/"), dirs[m["name"]])
            for m in container.get("volumeMounts") or []
        ),
        key=lambda pair: -len(pair[0]),
    )

    def word(text: str) -> str:
        if text == "0.0.0.0":
            return ip
        for mount, directory in mounts:
            if text == mount or text.startswith(mount + "/"):
                return str(directory) + text[len(mount) :]
        return text

    def rewrite(text: str) -> str:
        flag, equals, value = text.partition("=")
        if equals and flag.startswith("-"):
            return f"{flag}={word(value)}"
        return word(text)

    return rewrite


def launch(
    container: Obj, image: Image, dirs: Mapping[str, Path], fetch: Fetch, pod: PodContext
) -> Launch:
    """The process for ``container``, or :class:`ConfigError`."""
    env = _environment(container, fetch, pod)
    command = container.get("command") or image.entrypoint
    if not command:
        raise ConfigError(f"image {container['image']} has no entrypoint and no command is given")
    rewrite = _rewriter(container, dirs, pod.ip)
    argv = [rewrite(_expand(w, env)) for w in [*command, *(container.get("args") or [])]]
    env = {k: rewrite(v) for k, v in env.items()}
    base = {"PATH": image.path, "HOSTNAME": pod.name, "HOME": str(pod.root)}
    return Launch(argv=argv, env=base | env, cwd=pod.root)
