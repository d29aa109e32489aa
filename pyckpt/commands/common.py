"""Shared pieces of the command line: storage options and the wait for a remote store,
errors as one line of cause and fix, output, natural key order, progress bars."""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import traceback
from typing import Any, Callable, Iterable

from ..errors import CheckpointError
from ..storage import resolve
from ..storage.options import RemoteOptions

#: seconds ``--timeout`` waits by default for a remote store's first answer
DEFAULT_TIMEOUT = 10.0


def parse_options(pairs: list[str] | None) -> dict | None:
    """``key=value`` pairs (values parsed as JSON when they can be; dotted keys nest)."""
    if not pairs:
        return None
    out: dict = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key:
            raise SystemExit(f"pyckpt: --storage-option expects KEY=VALUE, got {pair!r}")
        try:
            value: Any = json.loads(raw)
        except ValueError:
            value = raw
        node = out
        *parents, leaf = key.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return out


def _positive(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a positive number of seconds, got {text!r}")
    return value


STORAGE_OPTION_HELP = ("fsspec storage option for remote URLs (repeatable; values are JSON "
                       "where they parse, dotted keys nest), e.g. endpoint_url=http://127.0.0.1:9000, "
                       "key=..., secret=..., anon=true, or pyckpt.deadline=120 (seconds an "
                       "operation may go without progress, default 60)")


def add_storage_options(p: argparse.ArgumentParser) -> None:
    """Adds the repeatable ``--storage-option KEY=VALUE`` argument (see ``parse_options``)
    and ``--timeout SECONDS`` (see ``reach``)."""
    p.add_argument("--storage-option", action="append", metavar="KEY=VALUE",
                   help=STORAGE_OPTION_HELP)
    p.add_argument("--timeout", type=_positive, default=DEFAULT_TIMEOUT, metavar="SECONDS",
                   help=f"seconds to wait for a remote store's first answer before giving up "
                        f"(default {DEFAULT_TIMEOUT:g}); raise it for a slow endpoint. Once the "
                        "store has answered, an operation gives up after pyckpt.deadline "
                        "seconds without progress (--storage-option pyckpt.deadline=SECONDS)")


def add_debug_option(p: argparse.ArgumentParser, default: Any = False) -> None:
    """Adds ``--debug``: the full traceback of a failure, and the storage clients' logs.
    (A subcommand's copy has ``default=argparse.SUPPRESS``, so that it does not undo a
    ``--debug`` given before the subcommand.)"""
    p.add_argument("--debug", action="store_true", default=default,
                   help="on failure, print the full traceback (and the storage clients' "
                        "warnings) besides the one-line message")


def add_output_options(p: argparse.ArgumentParser) -> None:
    """Adds ``--json`` (machine-readable output), ``--quiet``/``-q`` (no progress bar) and
    the subcommand's ``--debug``."""
    p.add_argument("--json", action="store_true", help="machine-readable output on stdout")
    p.add_argument("--quiet", "-q", action="store_true", help="no progress bar")
    add_debug_option(p, default=argparse.SUPPRESS)


# -- remote stores: the first answer, and errors as cause and fix --------------------------

def is_remote(url: Any) -> bool:
    """Whether ``url`` names a remote (fsspec) store rather than a local path."""
    return isinstance(url, str) and "://" in url and not url.startswith("file://")


class StoreProblem(Exception):
    """A remote store failed for a known reason (no credentials, unreachable...): the
    message names the cause and the fix; ``__cause__`` is the client's own error."""


def reach(args: argparse.Namespace, url: str, options: dict | None) -> None:
    """Makes sure the store of a remote ``url`` answers, within ``args.timeout`` seconds
    (a cheap existence check whose operation has that deadline), so that a command
    against an endpoint that does not answer fails quickly; the command's own
    operations then have the storage options' limits. A failure with a known cause
    raises StoreProblem; local paths are not checked."""
    if not is_remote(url):
        return
    timeout = float(getattr(args, "timeout", DEFAULT_TIMEOUT))
    so = dict(options or {})
    mine = so.get("pyckpt")
    if mine is None or isinstance(mine, dict):  # anything else: resolve reports it
        defaults = RemoteOptions()
        mine = dict(mine or {})
        mine["deadline"] = timeout
        for name in ("stall_timeout", "cleanup_timeout"):
            mine[name] = min(float(mine.get(name, getattr(defaults, name))), timeout)
        so["pyckpt"] = mine
    try:
        store, path = resolve(url, so)
        store.exists(path)
    except Exception as e:
        message = explain(e, url=url, options=options, timeout=timeout)
        if message is None:
            raise
        raise StoreProblem(message) from e


def _chain(exc: BaseException) -> list[BaseException]:
    out: list[BaseException] = []
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        e = todo.pop(0)
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        out.append(e)
        todo += [e.__cause__, e.__context__]
    return out


def _names(e: BaseException) -> set[str]:
    return {cls.__name__ for cls in type(e).__mro__}


def _code(e: BaseException) -> str | None:
    """The service's error code: botocore's ClientError, gcsfs' HttpError."""
    response = getattr(e, "response", None)
    if isinstance(response, dict):
        err = response.get("Error") or {}
        if err.get("Code") is not None:
            return str(err["Code"])
        status = (response.get("ResponseMetadata") or {}).get("HTTPStatusCode")
        return None if status is None else str(status)
    code = getattr(e, "code", None)
    if "HttpError" in _names(e) and code is not None:
        return str(code)
    return None


_NO_CREDENTIALS = {"NoCredentialsError", "PartialCredentialsError", "CredentialRetrievalError",
                   "DefaultCredentialsError", "RefreshError", "UnauthorizedSSOTokenError",
                   "SSOTokenLoadError", "NoAuthTokenError", "TokenRetrievalError"}
_REJECTED_CODES = {"InvalidAccessKeyId", "SignatureDoesNotMatch", "ExpiredToken",
                   "ExpiredTokenException", "InvalidToken", "TokenRefreshRequired",
                   "InvalidClientTokenId", "AuthFailure", "UnrecognizedClientException",
                   "RequestTimeTooSkewed", "401"}
_DENIED_CODES = {"AccessDenied", "AllAccessDisabled", "AccountProblem", "403"}
_NETWORK = {"EndpointConnectionError", "ConnectTimeoutError", "ConnectionClosedError",
            "ReadTimeoutError", "ClientConnectorError", "ClientConnectorDNSError",
            "ServerDisconnectedError", "ServerTimeoutError", "ClientOSError", "gaierror",
            "StallError", "ConnectionError", "ProxyConnectionError", "SSLError",
            "ClientConnectorCertificateError", "ClientSSLError", "FSTimeoutError"}


def _short(e: BaseException, limit: int = 160) -> str:
    text = " ".join(str(e).split())
    text = f"{type(e).__name__}: {text}" if text else type(e).__name__
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _endpoint(options: dict | None, text: str) -> str | None:
    for so in (options or {}, (options or {}).get("client_kwargs") or {}):
        if isinstance(so, dict) and isinstance(so.get("endpoint_url"), str):
            return so["endpoint_url"]
    m = re.search(r"endpoint URL: \"?(https?://[^/\"?\s]+)", text)
    if m:
        return m.group(1)
    for var in ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "FSSPEC_S3_ENDPOINT_URL",
                "STORAGE_EMULATOR_HOST"):
        if os.environ.get(var):
            return os.environ[var]
    return None


def _protocol(url: str | None) -> str:
    return url.split("://", 1)[0] if url and "://" in url else ""


def _credentials_fix(proto: str) -> str:
    if proto in ("gs", "gcs"):
        return ("run `gcloud auth application-default login`, set GOOGLE_APPLICATION_CREDENTIALS "
                "to a service-account key file, or pass --storage-option token=PATH "
                "(token=anon for a public bucket)")
    if proto in ("az", "abfs", "abfss"):
        return ("set AZURE_STORAGE_ACCOUNT_NAME and AZURE_STORAGE_ACCOUNT_KEY (or a SAS token), or "
                "pass --storage-option account_name=... --storage-option account_key=...")
    return ("set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE), or pass "
            "--storage-option key=... --storage-option secret=... "
            "(anon=true for a public bucket)")


def explain(exc: BaseException, *, url: str | None = None, options: dict | None = None,
            timeout: float | None = None, proto: str | None = None) -> str | None:
    """One line naming the cause and the fix of a remote store's failure (missing or
    rejected credentials, access denied, an endpoint that cannot be reached or does
    not answer), or None when the failure is none of these."""
    chain = _chain(exc)
    text = " | ".join(_short(e, 10_000) for e in chain)
    where = f" for {url}" if url else ""
    proto = _protocol(url) or proto or ""
    for e in chain:
        names = _names(e)
        if names & _NO_CREDENTIALS:
            return (f"no usable credentials{where} ({_short(e)}): {_credentials_fix(proto)}")
    for e in chain:
        code = _code(e)
        if code in _REJECTED_CODES:
            return (f"the store rejected the credentials{where} ({_short(e)}): check them "
                    f"(and the clock) or {_credentials_fix(proto)}")
        if code in _DENIED_CODES:
            return (f"access denied{where} ({_short(e)}): the credentials lack permission on "
                    "this bucket or prefix; use credentials that have it, or check the URL")
    if not any(_names(e) & _NETWORK for e in chain) and not re.search(
            r"Could not connect|Connection refused|Cannot connect to host|no bytes moved", text):
        return None
    if re.search(r"Name or service not known|nodename nor servname|getaddrinfo|"
                 r"name resolution|No address associated|ClientConnectorDNSError", text):
        reason = "host name not found"
    elif re.search(r"SSL|certificate", text):
        reason = "TLS failed: check http:// or https:// and the CA bundle (AWS_CA_BUNDLE)"
    elif re.search(r"Could not connect|Connection refused|Cannot connect to host|Connect call "
                   r"failed", text):
        reason = "could not connect"
    else:
        reason = "no answer"
    m = re.search(r"failed after \d+ attempt\(s\) in ([0-9.]+) s", text)
    waited = f"; gave up after {float(m.group(1)):.0f} s" if m else ""
    endpoint = _endpoint(options, text)
    target = f"the storage endpoint {endpoint}" if endpoint else "the storage endpoint"
    if timeout is not None:
        more = f"a slow endpoint may need a longer --timeout (now {timeout:g} s)"
    else:
        more = ("a slow store may need a longer --storage-option pyckpt.deadline=SECONDS "
                "(seconds without progress, default 60)")
    return (f"cannot reach {target}{where} ({reason}{waited}): check the endpoint URL "
            f"(--storage-option endpoint_url=URL), the network (proxy, firewall, VPN) and that "
            f"the service runs; {more}")


def describe_error(exc: BaseException, args: argparse.Namespace | None = None) -> str:
    """The one line that reports a command's failure: the cause and fix of a remote
    store's failure (``explain``), else the error's own message (its class too when it
    is not one of the errors commands expect)."""
    if isinstance(exc, StoreProblem):
        return str(exc)
    remote = [u for u in _urls(args) if is_remote(u)]
    message = explain(exc, url=remote[0] if len(set(remote)) == 1 else None,
                      options=_options_of(args) if remote else None,
                      proto=_protocol(remote[0]) if remote else None)
    if message is not None:
        return message
    if isinstance(exc, (CheckpointError, OSError, ValueError, ImportError)):
        return str(exc) or type(exc).__name__
    if isinstance(exc, KeyError):
        return str(exc.args[0]) if exc.args else "KeyError"
    return f"{_short(exc, 400)} (--debug shows the traceback)"


def _urls(args: argparse.Namespace | None) -> Iterable[Any]:
    for name in ("path", "a", "b", "src", "dst"):
        value = getattr(args, name, None)
        if value is not None:
            yield value


def _options_of(args: argparse.Namespace | None) -> dict | None:
    out: dict = {}
    for name in ("storage_option", "src_storage_option", "dst_storage_option"):
        out.update(parse_options(getattr(args, name, None)) or {})
    return out or None


def report_error(args: argparse.Namespace | None, exc: BaseException, prefix: str = "") -> int:
    """Prints a failure as one line on stderr (``pyckpt: <prefix><describe_error>``),
    after its full traceback with ``--debug``; returns exit status 1."""
    if getattr(args, "debug", False):
        traceback.print_exception(type(exc), exc, exc.__traceback__, file=sys.stderr)
    print(f"pyckpt: {prefix}{describe_error(exc, args)}", file=sys.stderr)
    return 1


# -- output -----------------------------------------------------------------------------

def natural_key(text: str) -> tuple:
    """Sort key that orders the numbers inside strings by value: ``w/2`` before ``w/10``."""
    parts = re.split(r"(\d+)", text)
    return tuple(int(p) if i % 2 else p for i, p in enumerate(parts)), text


def progress_bar(args: argparse.Namespace, desc: str) -> tuple[Callable[[int, int], None] | None,
                                                                 Callable[[], None]]:
    """(callback, close) for a byte progress bar on stderr, or (None, no-op) when
    stderr is not a terminal, with --quiet or --json."""
    if getattr(args, "quiet", False) or getattr(args, "json", False) or not sys.stderr.isatty():
        return None, lambda: None
    from tqdm import tqdm  # optional dependency: only drawn on a terminal

    bar = tqdm(total=None, desc=desc, unit="B", unit_scale=True, unit_divisor=1024, leave=True,
               file=sys.stderr)

    def update(done: int, total: int) -> None:
        if bar.total != total:
            bar.total = total
        bar.update(done - bar.n)

    def close() -> None:
        bar.refresh()  # the final state, however fast the operation was
        bar.close()

    return update, close


def emit_json(obj: Any) -> None:
    """Writes ``obj`` to stdout as indented JSON (``str()`` of what JSON cannot hold)."""
    json.dump(obj, sys.stdout, indent=2, default=str)
    sys.stdout.write("\n")


def human(n: float) -> str:
    """A byte count for people: ``512 B``, ``1.5 KiB`` ... ``TiB`` (powers of 1024)."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def fail(msg: str) -> int:
    """Prints ``pyckpt: <msg>`` to stderr; returns exit status 1."""
    print(f"pyckpt: {msg}", file=sys.stderr)
    return 1
