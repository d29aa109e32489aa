"""Why a remote store failed, in one line of cause and fix: missing or rejected
credentials, access denied, an endpoint that cannot be reached or does not answer.
The store's operations (retry.py) raise these as ``CheckpointIOError``; the command
line prints the same lines (commands/common.py)."""

from __future__ import annotations

import os
import re

__all__ = ["explain", "short", "protocol_of"]


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


def short(e: BaseException, limit: int = 160) -> str:
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


def protocol_of(url: str | None) -> str:
    return url.split("://", 1)[0] if url and "://" in url else ""


def _opts(cli: bool, *pairs: str) -> str:
    """How to pass storage options: ``--storage-option k=v`` on the command line,
    ``storage_options={'k': v}`` from Python."""
    if cli:
        return " ".join(f"--storage-option {p}" for p in pairs)
    items = ", ".join("'{}': {}".format(*p.split("=", 1)) for p in pairs).replace("true", "True")
    return f"storage_options={{{items}}}"


def _credentials_fix(proto: str, cli: bool = False) -> str:
    if proto in ("gs", "gcs"):
        return ("run `gcloud auth application-default login`, set GOOGLE_APPLICATION_CREDENTIALS "
                f"to a service-account key file, or pass {_opts(cli, 'token=PATH')} "
                f"({_opts(cli, 'token=anon')} for a public bucket)")
    if proto in ("az", "abfs", "abfss"):
        return ("set AZURE_STORAGE_ACCOUNT_NAME and AZURE_STORAGE_ACCOUNT_KEY (or a SAS token), or "
                f"pass {_opts(cli, 'account_name=...', 'account_key=...')}")
    return ("set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (or AWS_PROFILE), or pass "
            f"{_opts(cli, 'key=...', 'secret=...')} "
            f"({_opts(cli, 'anon=true')} for a public bucket)")


def explain(exc: BaseException, *, url: str | None = None, options: dict | None = None,
            timeout: float | None = None, proto: str | None = None,
            cli: bool = False) -> str | None:
    """One line naming the cause and the fix of a remote store's failure (missing or
    rejected credentials, access denied, an endpoint that cannot be reached or does
    not answer), or None when the failure is none of these."""
    chain = _chain(exc)
    text = " | ".join(short(e, 10_000) for e in chain)
    where = f" for {url}" if url else ""
    proto = protocol_of(url) or proto or ""
    for e in chain:
        names = _names(e)
        if names & _NO_CREDENTIALS:
            return (f"no usable credentials{where} ({short(e)}): {_credentials_fix(proto, cli)}")
    for e in chain:
        code = _code(e)
        if code in _REJECTED_CODES:
            return (f"the store rejected the credentials{where} ({short(e)}): check them "
                    f"(and the clock) or {_credentials_fix(proto, cli)}")
        if code in _DENIED_CODES:
            return (f"access denied{where} ({short(e)}): the credentials lack permission on "
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
        more = ("a slow store may need a longer "
                + ("--storage-option pyckpt.deadline=SECONDS" if cli
                   else "storage_options={'pyckpt': {'deadline': SECONDS}}")
                + " (seconds without progress, default 60)")
    return (f"cannot reach {target}{where} ({reason}{waited}): check the endpoint URL "
            f"({_opts(cli, 'endpoint_url=URL')}), the network (proxy, firewall, VPN) and that "
            f"the service runs; {more}")
