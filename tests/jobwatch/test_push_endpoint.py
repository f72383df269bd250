"""The push endpoint with the request HF Transformers' KubeflowCallback sends (urllib POST,
Content-Type application/json, Authorization Bearer, {"trainerStatus": {...}}), and every refusal
upstream's status server gives, with its exact bodies (kubeflow/trainer pkg/statusserver
server_test.go): 403, 404 (before the token's membership), 413, 422; plus our 401 and 503."""

from __future__ import annotations

import http.client
import json
import logging
import ssl
import urllib.error
import urllib.request
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from tests.jobwatch.fake_apiserver import FakeAPIServer, gpu_pod, trainjob_pod
from tests.jobwatch.rig import Running, jobwatch
from tests.tls_certs import make_certs

TOKEN = "eyJhbGciOiJSUzI1NiJ9.pod-bound-token"


def status_url(base: str, ns: str, name: str) -> str:
    return f"{base}/apis/trainer.kubeflow.org/v1alpha1/namespaces/{ns}/trainjobs/{name}/status"


def hf_payload(step: int = 450, total: int = 1000) -> dict[str, Any]:
    """What KubeflowCallback._post_status builds on a step end (research notes A2)."""
    return {"trainerStatus": {
        "lastUpdatedTime": datetime.now(UTC).isoformat(),
        "progressPercentage": min(int(step / total * 100), 99),
        "estimatedRemainingSeconds": 3600,
        "metrics": [{"name": "loss", "value": "0.2347"}, {"name": "grad_norm", "value": "0.91"},
                    {"name": "learning_rate", "value": "1.8e-05"}, {"name": "current_step", "value": str(step)},
                    {"name": "total_steps", "value": str(total)}, {"name": "current_epoch", "value": "1.35"}]}}


def post(url: str, body: bytes | dict[str, Any], token: str | None = TOKEN,
         context: ssl.SSLContext | None = None) -> tuple[int, Any]:
    """As the callback does it: urllib.request.urlopen(req, timeout=5, context=ssl_ctx)."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode("utf-8")
    headers = {"Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    req = urllib.request.Request(url, data=data, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(req, timeout=5, context=context) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


@pytest.fixture()
def fake() -> Iterator[FakeAPIServer]:
    with FakeAPIServer(bookmark_interval=0.2, max_watch_s=3) as f:
        f.trainer_served = False  # a cluster without Kubeflow: the callback posts to us
        f.apply("pods", gpu_pod("ft-0", "ml", labels={"batch.kubernetes.io/job-name": "ft"}, owner=("Job", "ft")))
        f.apply("pods", gpu_pod("other-0", "ml", labels={"batch.kubernetes.io/job-name": "other"},
                                owner=("Job", "other")))
        f.apply("pods", gpu_pod("nb-7d9f8-abcde", "ml", labels={"pod-template-hash": "7d9f8"},
                                owner=("ReplicaSet", "nb-7d9f8")))
        f.apply("pods", gpu_pod("ft-0", "team-b", labels={"batch.kubernetes.io/job-name": "ft"},
                                owner=("Job", "ft")))
        f.review(TOKEN, "ml", "ft-0")
        yield f


@pytest.fixture()
def r(fake: FakeAPIServer, tmp_path: Path) -> Iterator[Running]:
    with jobwatch(fake, tmp_path, "--push-listen", "127.0.0.1:0") as running:
        running.wait_for(lambda: len(running.app.state.pods) == 4, what="pods listed")
        yield running


def upstream_echo(payload: dict[str, Any]) -> bytes:
    """What upstream answers: json.NewEncoder(w).Encode(updateRequest), Go's field order, the time in
    RFC 3339 seconds (metav1.Time), compact, a newline."""
    ts = payload["trainerStatus"]
    when = datetime.fromisoformat(ts["lastUpdatedTime"]).astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    go = {"progressPercentage": ts["progressPercentage"], "estimatedRemainingSeconds": ts["estimatedRemainingSeconds"],
          "metrics": ts["metrics"], "lastUpdatedTime": when}
    return json.dumps({"trainerStatus": go}, separators=(",", ":")).encode() + b"\n"


def raw_post(port: int, path: str, body: bytes, headers: dict[str, str],
             conn: http.client.HTTPConnection | None = None) -> tuple[int, bytes, http.client.HTTPConnection]:
    conn = conn or http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    conn.request("POST", path, body=body, headers=headers)
    resp = conn.getresponse()
    return resp.status, resp.read(), conn


def test_hf_callback_request_is_accepted_and_echoed(r: Running, fake: FakeAPIServer) -> None:
    payload = hf_payload(450)
    payload["trainerStatus"]["unknownField"] = "dropped"  # Go decodes known fields only
    code, raw, conn = raw_post(r.app.push_port or 0, status_url("", "ml", "ft"), json.dumps(payload).encode(),
                               {"Content-Type": "application/json", "Authorization": f"Bearer {TOKEN}"})
    conn.close()
    assert (code, raw) == (200, upstream_echo(payload))
    assert r.value("gpu_job_progress_step", job_kind="Job", job_name="ft") == 450
    assert r.value("gpu_job_progress_ratio", job_name="ft") == 0.45
    assert r.value("gpu_job_progress_source_info", job_name="ft", source="push") == 1
    assert r.value("gpu_job_metric", job_name="ft", name="loss", phase="train") == 0.2347
    assert r.value("gpu_jobwatch_push_requests_total", code="200") == 1
    review = fake.review_requests[-1]
    assert review["spec"] == {"token": TOKEN, "audiences": ["gpu-telemetry"]}
    assert fake.writes == []  # nothing received reaches the API server


def test_push_without_trainer_status_is_a_no_op_200(r: Running) -> None:
    assert post(status_url(r.push_url, "ml", "ft"), {}) == (200, {})
    assert post(status_url(r.push_url, "ml", "no-such-job"), {}) == (200, {})  # upstream: before the lookup
    assert post(status_url(r.push_url, "ml", "ft"), b"null") == (200, {})
    assert r.value("gpu_job_progress_step", job_name="ft") is None


def test_token_reviews_are_cached(r: Running, fake: FakeAPIServer) -> None:
    for step in (10, 20, 30):
        assert post(status_url(r.push_url, "ml", "ft"), hf_payload(step))[0] == 200
    assert len(fake.review_requests) == 1
    assert r.value("gpu_job_progress_step", job_name="ft") == 30


UPSTREAM_MESSAGES = {("NotFound", 404): "Not found", ("Forbidden", 403): "Forbidden",
                     ("RequestEntityTooLarge", 413): "Payload too large", ("Invalid", 422): "Invalid payload",
                     ("Unauthorized", 401): "Unauthorized"}


def _assert_status(code: int, body: Any, want: int, reason: str, message: str | None = None) -> None:
    """The metav1.Status upstream's badRequest writes (no kind/apiVersion: Go's TypeMeta is empty there)."""
    assert code == want
    message = message or UPSTREAM_MESSAGES[(reason, want)]
    assert body == {"metadata": {}, "status": "Failure", "message": message, "reason": reason, "code": want}


def test_no_token_or_an_invalid_one_is_401(r: Running) -> None:
    url = status_url(r.push_url, "ml", "ft")
    _assert_status(*post(url, hf_payload(), token=None), 401, "Unauthorized")
    _assert_status(*post(url, hf_payload(), token="not-a-valid-token"), 401, "Unauthorized")
    assert r.value("gpu_jobwatch_push_requests_total", code="401") == 2
    assert r.value("gpu_job_progress_step", job_name="ft") is None


def test_a_review_answer_without_our_audience_is_401(r: Running, fake: FakeAPIServer) -> None:
    """An authenticator that is not audience-aware (a legacy secret token) answers without
    status.audiences: kube-apiserver's webhook authenticator then refuses it, and so do we."""
    fake.review("legacy-token", "ml", "ft-0")
    del fake.reviews["legacy-token"]["audiences"]
    _assert_status(*post(status_url(r.push_url, "ml", "ft"), hf_payload(), token="legacy-token"), 401, "Unauthorized")
    assert r.value("gpu_job_progress_step", job_name="ft") is None


def test_a_token_for_another_audience_is_401(r: Running, fake: FakeAPIServer) -> None:
    fake.review("trainer-audience-token", "ml", "ft-0", audiences=("trainer.kubeflow.org/v1alpha1/namespaces/ml/"
                                                                   "trainjobs/ft/status",))
    _assert_status(*post(status_url(r.push_url, "ml", "ft"), hf_payload(), token="trainer-audience-token"),
                   401, "Unauthorized")


def test_a_token_of_another_namespace_is_403(r: Running) -> None:
    _assert_status(*post(status_url(r.push_url, "team-b", "ft"), hf_payload()), 403, "Forbidden")


def test_an_unknown_job_is_404_before_membership_is_checked(r: Running, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="jobwatch")
    for _ in range(3):
        code, body = post(status_url(r.push_url, "ml", "no-such-job"), hf_payload())
        _assert_status(code, body, 404, "NotFound", "Train job not found")  # upstream's message
    refused = [m for m in caplog.messages if "no-such-job" in m]
    assert len(refused) == 1 and "404" in refused[0]  # logged once per job and code, with the reason
    assert all(TOKEN not in m for m in caplog.messages)
    # upstream decodes the body before it looks the job up: a body that does not decode is 422 first
    _assert_status(*post(status_url(r.push_url, "ml", "no-such-job"), b"{not json"), 422, "Invalid")


def test_a_pod_of_another_job_is_403(r: Running, fake: FakeAPIServer) -> None:
    _assert_status(*post(status_url(r.push_url, "ml", "other"), hf_payload()), 403, "Forbidden")
    fake.reviews["unbound"] = {**fake.reviews[TOKEN], "user": {"username": "system:serviceaccount:ml:default"}}
    _assert_status(*post(status_url(r.push_url, "ml", "ft"), hf_payload(), token="unbound"), 403, "Forbidden")
    assert r.value("gpu_job_progress_step", job_name="other") is None


def test_a_body_over_64_kib_is_413(r: Running) -> None:
    big = hf_payload()
    big["trainerStatus"]["metrics"] += [{"name": f"m{i}", "value": "x" * 60} for i in range(1000)]
    _assert_status(*post(status_url(r.push_url, "ml", "ft"), big), 413, "RequestEntityTooLarge")
    assert r.value("gpu_jobwatch_push_requests_total", code="413") == 1


def _chunked(body: bytes, size: int = 1000) -> bytes:
    parts = [body[i:i + size] for i in range(0, len(body), size)]
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts) + b"0\r\n\r\n"


def test_a_chunked_body_is_read_up_to_64_kib(r: Running) -> None:
    """Upstream reads a body without Content-Length through its 64 KiB limit (server_test.go)."""
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {TOKEN}",
               "Transfer-Encoding": "chunked"}
    code, raw, conn = raw_post(r.app.push_port or 0, status_url("", "ml", "ft"),
                               _chunked(json.dumps(hf_payload(77)).encode()), headers)
    assert code == 200 and json.loads(raw)["trainerStatus"]["progressPercentage"] == 7
    assert r.value("gpu_job_progress_step", job_name="ft") == 77
    big = hf_payload()
    big["trainerStatus"]["metrics"] += [{"name": f"m{i}", "value": "x" * 60} for i in range(1000)]
    code, raw, conn = raw_post(0, status_url("", "ml", "ft"), _chunked(json.dumps(big).encode()), headers, conn)
    _assert_status(code, json.loads(raw), 413, "RequestEntityTooLarge")
    conn.close()


def test_a_refused_request_with_a_body_leaves_no_garbage_on_a_kept_alive_connection(r: Running) -> None:
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {TOKEN}"}
    body = json.dumps(hf_payload(5)).encode()
    code, _, conn = raw_post(r.app.push_port or 0, status_url("", "ml", "no-such-job"), body, headers)
    assert code == 404  # answered before the body was read
    try:  # the connection is closed (its unread body is not parsed as a next request) or still good
        code, raw, conn = raw_post(0, status_url("", "ml", "ft"), body, headers, conn)
    except (TimeoutError, http.client.HTTPException, ConnectionError):
        code, raw, conn = raw_post(r.app.push_port or 0, status_url("", "ml", "ft"), body, headers)
    assert code == 200 and json.loads(raw)["trainerStatus"]["metrics"][3]["value"] == "5"
    conn.close()


@pytest.mark.parametrize(("body", "why"), [
    (b"{not json", None),  # does not decode: upstream's "Invalid payload"
    (b"{} trailing", None),
    (b'["a list"]', None),
    (b'{"trainerStatus": "text"}', None),
    (b'{"trainerStatus": {"lastUpdatedTime": "2026-06-12T03:00:00Z", "estimatedRemainingSeconds": NaN}}', None),
    (b'{"trainerStatus": {"progressPercentage": 45}}', "lastUpdatedTime is required"),  # the CRD's rule
    (json.dumps({"trainerStatus": {**hf_payload()["trainerStatus"], "progressPercentage": 150}}).encode(),
     "progressPercentage: 150 is outside 0..100"),
    (json.dumps({"trainerStatus": {**hf_payload()["trainerStatus"],
                                   "metrics": [{"name": "current_step", "value": "-3"}]}}).encode(),
     "current_step: '-3' is negative"),
])
def test_bad_bodies_are_422_and_never_progress(r: Running, body: bytes, why: str | None) -> None:
    code, answer = post(status_url(r.push_url, "ml", "ft"), body)
    if why is None:
        _assert_status(code, answer, 422, "Invalid")
    else:  # a body that decodes but is not valid: the reason, as the API server's validation gives one
        _assert_status(code, answer, 422, "Invalid", answer["message"])
        assert why in answer["message"]
    assert r.value("gpu_job_progress_step", job_name="ft") is None
    errors = r.scrape().get("gpu_jobwatch_progress_errors_total", {})
    assert sum(v for ls, v in errors.items() if ("source", "push") in ls) == 1


def test_wrong_path_and_method(r: Running) -> None:
    code, body = post(r.push_url + "/apis/trainer.kubeflow.org/v1alpha1/namespaces/ml/trainjobs/ft", hf_payload())
    _assert_status(code, body, 404, "NotFound")
    with pytest.raises(urllib.error.HTTPError) as err:  # upstream routes only POST there: the catch-all 404
        urllib.request.urlopen(status_url(r.push_url, "ml", "ft"), timeout=5)
    _assert_status(err.value.code, json.loads(err.value.read()), 404, "NotFound")


def test_any_workload_kind_is_a_job_by_name(r: Running, fake: FakeAPIServer) -> None:
    fake.review("nb-token", "ml", "nb-7d9f8-abcde")
    assert post(status_url(r.push_url, "ml", "nb"), hf_payload(7), token="nb-token")[0] == 200
    assert r.value("gpu_job_progress_step", job_kind="Deployment", job_name="nb") == 7


def test_trainjob_status_wins_over_push(fake: FakeAPIServer, tmp_path: Path) -> None:
    from tests.jobwatch.fake_apiserver import trainer_status, trainjob
    fake.trainer_served = True
    fake.apply("pods", trainjob_pod("llama", 0))
    fake.review("llama-token", "ml", "llama-node-0-0-x0")
    with jobwatch(fake, tmp_path, "--push-listen", "127.0.0.1:0") as r:
        r.wait_for(lambda: len(r.app.state.pods) == 5, what="pods listed")
        assert post(status_url(r.push_url, "ml", "llama"), hf_payload(5), token="llama-token")[0] == 200
        assert r.value("gpu_job_progress_source_info", job_name="llama", source="push") == 1
        fake.apply("trainjobs", trainjob("llama", status=trainer_status(900)))
        r.wait_value("gpu_job_progress_step", 900, job_name="llama")
        assert r.value("gpu_job_progress_source_info", job_name="llama", source="trainjob_status") == 1
        assert r.value("gpu_job_progress_source_info", job_name="llama", source="push") is None


def test_tokenreview_unavailable_is_503_and_not_cached(r: Running, fake: FakeAPIServer) -> None:
    fake.set_mode("forbidden")
    _assert_status(*post(status_url(r.push_url, "ml", "ft"), hf_payload()), 503, "ServiceUnavailable",
                   "the token cannot be verified now; retry later")
    fake.set_mode("ok")
    assert post(status_url(r.push_url, "ml", "ft"), hf_payload())[0] == 200


def test_push_over_tls(fake: FakeAPIServer, tmp_path: Path) -> None:
    certs = make_certs(tmp_path / "certs")
    with jobwatch(fake, tmp_path, "--push-listen", "127.0.0.1:0", "--push-tls-cert", str(certs.server_cert),
                  "--push-tls-key", str(certs.server_key)) as r:
        r.wait_for(lambda: len(r.app.state.pods) == 4)
        ctx = ssl.create_default_context(cafile=str(certs.ca))  # KUBEFLOW_TRAINER_SERVER_CA_CERT
        url = status_url(f"https://127.0.0.1:{r.app.push_port}", "ml", "ft")
        assert post(url, hf_payload(12), context=ctx)[0] == 200
        assert r.value("gpu_job_progress_step", job_name="ft") == 12


def test_push_is_off_by_default(fake: FakeAPIServer, tmp_path: Path) -> None:
    with jobwatch(fake, tmp_path) as r:
        assert r.app.push_server is None
        assert r.app.settings.listen == "127.0.0.1:0"
