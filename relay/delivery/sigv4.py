"""SigV4 request signing for Amazon Managed Prometheus, with credentials that refresh themselves.

Credentials come from botocore's default chain (env, shared config/profile, IRSA web identity,
EKS Pod Identity / ECS container provider, IMDSv2), or from an STS assume-role on top of that chain
when ``role_arn`` is set. Temporary credentials are ``RefreshableCredentials``: botocore renews them
ahead of expiry (advisory window 15 min, mandatory 10 min), so a long-running relay never signs
with a stale token (prometheus/prometheus #15186, grafana/alloy #6235). ``force_refresh`` is the
escape hatch after a 403 "security token ... expired" anyway (clock skew, revoked session).

Static keys (``sigv4.access_key`` / ``secret_key``) are used as given when both are set.

Signing takes a frozen copy of the credentials for each request and signs with a fresh
requests-aws4auth ``AWS4Auth`` built from it: nothing mutable is shared between the shard threads,
so no lock of ours is held while botocore refreshes credentials over the network. During botocore's
advisory window one thread refreshes while the others keep signing with the still-valid
credentials; ``force_refresh`` (after a 403 "expired") runs in the caller's thread and never blocks
signing either. Secrets are never logged; ``repr`` shows region, service, role and the credential
method only.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import botocore.credentials
import botocore.exceptions
import botocore.session
import requests
from requests_aws4auth import AWS4Auth

from relay.common.ratelog import RateLimitedLog
from relay.config.config import SigV4Config

log = logging.getLogger("relay.sigv4")
_FAILURES = RateLimitedLog(log)

ROLE_SESSION_NAME = "gpu-relay"


class SigV4ConfigError(ValueError):
    """Signing cannot be set up (no region, no credentials); carries the field and value."""

    def __init__(self, message: str, field: str, value: object) -> None:
        super().__init__(f"sigv4.{field}: {message}" if not message.startswith("destination ") else message)
        self.message = message
        self.field = field
        self.value = value


def from_config(destination: str, cfg: SigV4Config) -> SigV4Auth:
    """SigV4Auth for a destination's ``sigv4:`` block; a failure is a SigV4ConfigError whose message
    names the destination and what to do (the service prints it as one line, no traceback)."""
    try:
        return SigV4Auth(
            region=cfg.region, service=cfg.service, profile=cfg.profile, role_arn=cfg.role_arn,
            external_id=cfg.external_id, access_key=cfg.access_key, secret_key=cfg.secret_key,
        )
    except SigV4ConfigError as e:
        raise SigV4ConfigError(f"destination {destination!r}: {e.message}", e.field, e.value) from None
    except botocore.exceptions.BotoCoreError as e:  # ProfileNotFound, a broken config file, ...
        raise SigV4ConfigError(
            f"destination {destination!r}: cannot set up AWS credentials ({type(e).__name__}: {e}); "
            "check sigv4.profile and the AWS config files", "credentials", None) from None


class SigV4Auth(requests.auth.AuthBase):
    """requests auth hook: signs each request for ``service`` in ``region``."""

    def __init__(
        self,
        region: str,
        service: str = "aps",
        profile: str | None = None,
        role_arn: str | None = None,
        external_id: str | None = None,
        session: botocore.session.Session | None = None,
        access_key: str | None = None,
        secret_key: str | None = None,
    ) -> None:
        if not region:
            raise SigV4ConfigError("a region is required (the workspace's region)", "region", region)
        if not service:
            raise SigV4ConfigError("a service name is required", "service", service)
        self.region = region
        self.service = service
        self.role_arn = role_arn
        self._session = session if session is not None else botocore.session.Session(profile=profile)
        if session is not None and profile:
            self._session.set_config_variable("profile", profile)
        self._external_id = external_id
        self._refresh_lock = threading.Lock()  # one force_refresh at a time; signing never takes it
        self._logged_key: object = None  # the access key of the last "refreshed" line
        if bool(access_key) != bool(secret_key):
            raise SigV4ConfigError("access_key and secret_key must be given together (or neither: then the "
                                   "default credential chain is used)", "access_key", None)
        if access_key and secret_key:
            self._static: Any = botocore.credentials.Credentials(access_key, secret_key, method="static-config")
            self.credentials = self._resolve(self._static)
        else:
            self._static = None
            self.credentials = self._resolve(self._session.get_credentials())

    def _resolve(self, base: Any) -> Any:
        if base is None:
            raise SigV4ConfigError(
                "no AWS credentials found (env, profile, web identity, container, instance metadata); "
                "give the pod an IAM role (IRSA or EKS Pod Identity), or set sigv4.profile, or "
                "sigv4.access_key and sigv4.secret_key",
                "credentials",
                None,
            )
        if not self.role_arn:
            return base
        extra: dict[str, str] = {"RoleSessionName": ROLE_SESSION_NAME}
        if self._external_id:
            extra["ExternalId"] = self._external_id
        fetcher = botocore.credentials.AssumeRoleCredentialFetcher(
            client_creator=self._client_creator,
            source_credentials=base,
            role_arn=self.role_arn,
            extra_args=extra,
        )
        return botocore.credentials.DeferredRefreshableCredentials(
            refresh_using=fetcher.fetch_credentials, method="assume-role"
        )

    def _client_creator(self, service_name: str, **kwargs: Any) -> Any:
        kwargs.setdefault("region_name", self.region)
        return self._session.create_client(service_name, **kwargs)

    @property
    def method(self) -> str:
        """Where the credentials came from (env, assume-role, ...); safe to log."""
        return str(getattr(self.credentials, "method", "unknown"))

    def __call__(self, r: requests.PreparedRequest) -> requests.PreparedRequest:
        frozen = self.credentials.get_frozen_credentials()  # botocore refreshes here if due
        signer = AWS4Auth(frozen.access_key, frozen.secret_key, self.region, self.service,
                          session_token=frozen.token)
        signed: requests.PreparedRequest = signer(r)
        return signed

    def force_refresh(self) -> None:
        """Re-resolve credentials now (after a 403 'expired token'); never raises. Signing goes on
        with the current credentials meanwhile."""
        if not self._refresh_lock.acquire(blocking=False):
            return  # another shard is refreshing already
        try:
            creds = self.credentials
            refresh_lock = getattr(creds, "_refresh_lock", None)
            protected_refresh = getattr(creds, "_protected_refresh", None)
            if refresh_lock is not None and callable(protected_refresh):
                with refresh_lock:  # botocore's own refresh, forced past its expiry windows
                    protected_refresh(is_mandatory=True)
            elif self._static is None:  # chain credentials: run the chain again (env or files changed)
                resolver = self._session.get_component("credential_provider")
                self.credentials = self._resolve(resolver.load_credentials())
            # a destination holding its data after a 403 refreshes before each retry: one line a change
            # of the access key, and at most one failure a minute, not one a retry
            key = getattr(getattr(self.credentials, "get_frozen_credentials", lambda: None)(), "access_key", None)
            if key != self._logged_key:
                self._logged_key = key
                log.info("sigv4 credentials refreshed (method %s)", self.method)
            else:
                log.debug("sigv4 credentials refreshed, the same key (method %s)", self.method)
        except Exception as e:  # keep the old credentials; the retry will tell
            _FAILURES.warning("refresh", "sigv4 credential refresh failed: %s", type(e).__name__)
        finally:
            self._refresh_lock.release()

    def __repr__(self) -> str:
        return (
            f"SigV4Auth(region={self.region!r}, service={self.service!r}, role_arn={self.role_arn!r}, "
            f"method={self.method!r})"
        )

