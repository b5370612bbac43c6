"""The operator's settings: one frozen tree, parsed once from the command line in ``main()``.

A command line that cannot work is refused here with one line saying what and how to fix it.
The environment adds what a cluster's image mirror needs (:data:`IMAGE_VARIABLES`).
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Mapping, Sequence
from typing import NoReturn
from urllib.parse import urlsplit

import msgspec

from fleet_serving import images
from fleet_serving.credentials import TokenFile
from fleet_serving.errors import ConfigError
from fleet_serving.reporting import ReporterSettings

__all__ = ["IMAGE_VARIABLES", "Settings", "fetch_images", "parse_args", "parse_duration"]

IMAGE_VARIABLES = {
    "FLEET_SERVING_FETCH_IMAGE": "registry",
    "FLEET_SERVING_S3_FETCH_IMAGE": "s3",
}
"""Environment variables replacing the init containers' default images (an air-gapped cluster's
mirror): the ``registry:`` fetcher (curl) and the ``s3://`` copier (the AWS CLI)."""

_DURATION = re.compile(r"^([0-9]+(?:\.[0-9]+)?)(ms|s|m|h)?$")
_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}
_SECRET_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")


class Settings(msgspec.Struct, kw_only=True, frozen=True):
    """Everything ``fleet-serving run`` is configured with."""

    reporter: ReporterSettings
    engine_token_secret: str = "fleet-engine-token"
    """The Secret (key ``token``), in each FleetModel's namespace, whose engine credential the
    init container of a ``registry:`` model sends to download its files."""
    namespaces: tuple[str, ...] = ()
    """Namespaces to watch for FleetModels; empty means all (cluster-wide)."""
    host_mount_namespaces: tuple[str, ...] = ()
    """Namespaces, labelled Pod Security ``privileged`` by the install, where accelerators whose
    driver is mounted from the host (Ascend) may run; elsewhere they are refused (ADR 0025)."""
    liveness: str = "http://0.0.0.0:8080/healthz"
    """kopf's liveness endpoint, for the Pod's livenessProbe."""
    resync_seconds: float = 60.0
    """How often every FleetModel is reconciled again, to catch missed events and drift."""
    fetch_images: images.FetchImages = images.DEFAULT
    """The weight fetchers' images (``FLEET_SERVING_FETCH_IMAGE``,
    ``FLEET_SERVING_S3_FETCH_IMAGE``); a FleetModel's ``fetchImage`` replaces them."""
    kubeconfig: str | None = None
    """A kubeconfig path (from ``KUBECONFIG``) used when not running in a cluster."""
    log_format: str = "json"
    verbose: bool = False


def parse_duration(text: str) -> float:
    """``30s``, ``2m``, ``500ms``, ``1h`` or plain seconds, as seconds; positive only."""
    match = _DURATION.match(text.strip())
    if not match or float(match.group(1)) <= 0:
        raise ValueError(f"{text!r} is not a duration like 30s, 2m or 500ms")
    return float(match.group(1)) * _UNITS[match.group(2)]


def _url(text: str) -> str:
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{text!r} is not an http(s) URL like http://fleet-apiserver:8081")
    return text.rstrip("/")


class _OneLineParser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise ConfigError(f"{message} (see --help)")


def _parser() -> argparse.ArgumentParser:
    parser = _OneLineParser(prog="fleet-serving", description="Fleet's Kubernetes operator.")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_OneLineParser)
    run = commands.add_parser("run", help="run the operator")
    run.add_argument("--report-to", required=True, help="control plane URL for the inventory")
    run.add_argument("--cluster", default="default", help="this cluster's id in the inventory")
    run.add_argument(
        "--report-token-file",
        required=True,
        help="a file holding the operator credential for --cluster (a mounted Secret)",
    )
    run.add_argument(
        "--engine-token-secret",
        default="fleet-engine-token",
        help="Secret (key 'token') with the engine credential, in each model's namespace",
    )
    scope = run.add_mutually_exclusive_group()
    scope.add_argument("--namespace", action="append", default=[], help="watch only this one")
    scope.add_argument("--all-namespaces", action="store_true", help="watch all (default)")
    run.add_argument(
        "--host-mount-namespace",
        action="append",
        default=[],
        help="a privileged namespace where Ascend models (driver hostPath mounts) may run",
    )
    run.add_argument("--report-interval", default="30s", help="heartbeat period, e.g. 30s")
    run.add_argument("--resync", default="60s", help="full reconcile period, e.g. 60s")
    run.add_argument("--liveness", default="http://0.0.0.0:8080/healthz", help="liveness URL")
    run.add_argument("--log-format", choices=["json", "plain"], default="json")
    run.add_argument("--verbose", action="store_true", help="debug-level logs")
    return parser


def fetch_images(environ: Mapping[str, str]) -> images.FetchImages:
    """The init containers' images, the defaults replaced by what the environment sets."""
    chosen: dict[str, str] = {}
    for variable, field in IMAGE_VARIABLES.items():
        value = environ.get(variable, "")
        if not value:
            continue
        try:
            chosen[field] = images.check_reference(value)
        except ValueError as exc:
            raise ConfigError(f"{variable}: {exc}") from exc
    return msgspec.structs.replace(images.DEFAULT, **chosen)


def parse_args(argv: Sequence[str], environ: Mapping[str, str]) -> Settings:
    """Settings from a command line; :class:`ConfigError` with one line when it cannot work."""
    args = _parser().parse_args(list(argv))
    token = TokenFile(path=args.report_token_file)
    try:
        reporter = ReporterSettings(
            url=_url(args.report_to),
            cluster_id=args.cluster,
            interval=parse_duration(args.report_interval),
            token=token,
        )
        resync = parse_duration(args.resync)
        _url(args.liveness)
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc
    if not args.cluster.strip():
        raise ConfigError("--cluster must not be empty")
    if not _SECRET_NAME.match(args.engine_token_secret):
        raise ConfigError(
            f"--engine-token-secret {args.engine_token_secret!r} is not a Secret name"
        )
    fetch = fetch_images(environ)
    token.check()
    return Settings(
        reporter=reporter,
        engine_token_secret=args.engine_token_secret,
        namespaces=tuple(args.namespace),
        host_mount_namespaces=tuple(args.host_mount_namespace),
        liveness=args.liveness,
        resync_seconds=resync,
        fetch_images=fetch,
        kubeconfig=environ.get("KUBECONFIG") or None,
        log_format=args.log_format,
        verbose=args.verbose,
    )
