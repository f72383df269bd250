"""SigV4 request signing for Amazon Managed Prometheus, with credentials that refresh themselves.

Credentials come from botocore's default chain (env, shared config/profile, IRSA web identity,
EKS Pod Identity / ECS container provider, IMDSv2), or from an STS assume-role on top of that chain
when ``role_arn`` is set. Temporary credentials are ``RefreshableCredentials``: botocore renews them
ahead of expiry (advisory window 15 min, mandatory 10 min), so a long-running relay never signs
with a stale token (prometheus/prometheus #15186, grafana/alloy #6235). ``force_refresh`` is the
escape hatch after a 403 "security token ... expired" anyway (clock skew, revoked session).

Signing uses requests-aws4auth's ``AWS4Auth(refreshable_credentials=...)``, which reads frozen
credentials for every request. AWS4Auth keeps per-request state on the instance, so calls are
serialised with a lock: one destination's shard threads share one signer. Secrets are never logged;
``repr`` shows region, service, role and the credential method only.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import botocore.credentials
import botocore.session
import requests
from requests_aws4auth import AWS4Auth

log = logging.getLogger(__name__)

ROLE_SESSION_NAME = "gpu-relay"


class SigV4ConfigError(ValueError):
    """Signing cannot be set up (no region, no credentials); carries the field and value."""

    def __init__(self, message: str, field: str, value: object) -> None:
        super().__init__(f"sigv4.{field}: {message}")
        self.field = field
        self.value = value


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
        self._lock = threading.Lock()
        self.credentials = self._resolve(self._session.get_credentials())
        self._signer = AWS4Auth(region=region, service=service, refreshable_credentials=self.credentials)

    def _resolve(self, base: Any) -> Any:
        if base is None:
            raise SigV4ConfigError(
                "no AWS credentials found (env, profile, web identity, container, instance metadata)",
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
        with self._lock:
            signed: requests.PreparedRequest = self._signer(r)
            return signed

    def force_refresh(self) -> None:
        """Re-resolve credentials now (after a 403 'expired token'); never raises."""
        with self._lock:
            creds = self.credentials
            try:
                refresh_lock = getattr(creds, "_refresh_lock", None)
                protected_refresh = getattr(creds, "_protected_refresh", None)
                if refresh_lock is not None and callable(protected_refresh):
                    with refresh_lock:  # botocore's own refresh, forced past its expiry windows
                        protected_refresh(is_mandatory=True)
                else:  # static credentials: run the chain again (env or files may have changed)
                    resolver = self._session.get_component("credential_provider")
                    self.credentials = self._resolve(resolver.load_credentials())
                    self._signer = AWS4Auth(
                        region=self.region, service=self.service, refreshable_credentials=self.credentials
                    )
                log.info("sigv4 credentials refreshed (method %s)", self.method)
            except Exception as e:  # keep the old credentials; the retry will tell
                log.warning("sigv4 credential refresh failed: %s", type(e).__name__)

    def __repr__(self) -> str:
        return (
            f"SigV4Auth(region={self.region!r}, service={self.service!r}, role_arn={self.role_arn!r}, "
            f"method={self.method!r})"
        )

