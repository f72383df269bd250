"""deploy/aws/: the IAM policy (aps:RemoteWrite on one workspace, nothing more), the IRSA and EKS Pod
Identity trust policies and the Pod Identity association; and the README's `aws` commands, checked
against botocore's own service models (operation names, parameter names, required parameters)."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from string import Template
from typing import Any

import botocore.session
import pytest
from botocore import xform_name

from tests.deploy.render import DEPLOY, ROOT

AWS = DEPLOY / "aws"
SAMPLE = {
    "AWS_REGION": "eu-west-1",
    "AWS_ACCOUNT_ID": "123456789012",
    "AMP_WORKSPACE_ID": "ws-1a2b3c4d-5e6f-7a8b-9c0d-1e2f3a4b5c6d",
    "OIDC_PROVIDER": "oidc.eks.eu-west-1.amazonaws.com/id/EXAMPLED539D4633E53DE1B71EXAMPLE",
    "PROMETHEUS_NAMESPACE": "monitoring",
    "PROMETHEUS_SERVICE_ACCOUNT": "kube-prometheus-stack-prometheus",
    "CLUSTER_NAME": "gpu-prod",
}
# The aws CLI's own options, valid on every command.
GLOBAL_OPTIONS = {"--query", "--output", "--region", "--profile", "--cli-input-json", "--no-cli-pager"}


def load(name: str, substitute: bool = True) -> Any:
    text = (AWS / name).read_text()
    if substitute:
        text = Template(text).substitute(SAMPLE)  # what envsubst does; a missing variable raises
    return json.loads(text)


def statements(doc: dict[str, Any]) -> list[dict[str, Any]]:
    assert doc["Version"] == "2012-10-17"
    stmts: list[dict[str, Any]] = doc["Statement"]
    return stmts


def as_list(v: str | list[str]) -> list[str]:
    return [v] if isinstance(v, str) else v


@pytest.mark.parametrize("name", sorted(p.name for p in AWS.glob("*.json")))
def test_aws_file_is_valid_json_before_and_after_substitution(name: str) -> None:
    load(name, substitute=False)
    load(name)


def test_iam_policy_allows_only_remote_write_on_the_workspace() -> None:
    (stmt,) = statements(load("amp-remote-write-policy.json"))
    assert stmt["Effect"] == "Allow"
    assert as_list(stmt["Action"]) == ["aps:RemoteWrite"]
    (resource,) = as_list(stmt["Resource"])
    assert resource == "arn:aws:aps:eu-west-1:123456789012:workspace/ws-1a2b3c4d-5e6f-7a8b-9c0d-1e2f3a4b5c6d"
    assert "*" not in resource and "Condition" not in stmt


def test_irsa_trust_policy_trusts_the_cluster_oidc_provider_for_one_service_account() -> None:
    (stmt,) = statements(load("irsa-trust-policy.json"))
    assert stmt["Effect"] == "Allow"
    oidc = SAMPLE["OIDC_PROVIDER"]
    assert stmt["Principal"] == {"Federated": f"arn:aws:iam::123456789012:oidc-provider/{oidc}"}
    assert as_list(stmt["Action"]) == ["sts:AssumeRoleWithWebIdentity"]
    assert stmt["Condition"] == {"StringEquals": {
        f"{oidc}:sub": "system:serviceaccount:monitoring:kube-prometheus-stack-prometheus",
        f"{oidc}:aud": "sts.amazonaws.com",
    }}


def test_pod_identity_trust_policy_trusts_the_eks_pod_identity_service() -> None:
    (stmt,) = statements(load("pod-identity-trust-policy.json"))
    assert stmt["Effect"] == "Allow"
    assert stmt["Principal"] == {"Service": "pods.eks.amazonaws.com"}
    assert sorted(as_list(stmt["Action"])) == ["sts:AssumeRole", "sts:TagSession"]


def botocore_input(service: str, operation: str) -> Any:
    model = botocore.session.get_session().get_service_model(service)
    names = {xform_name(op): op for op in model.operation_names}
    assert operation.replace("-", "_") in names, f"aws {service} {operation}: no such operation"
    return model.operation_model(names[operation.replace("-", "_")]).input_shape


def test_pod_identity_association_is_the_input_of_create_pod_identity_association() -> None:
    assoc = load("pod-identity-association.json")
    shape = botocore_input("eks", "create-pod-identity-association")
    assert set(assoc) <= set(shape.members)
    assert set(shape.required_members) <= set(assoc)
    assert assoc["namespace"] == "monitoring" and assoc["serviceAccount"] == "kube-prometheus-stack-prometheus"
    assert re.fullmatch(r"arn:aws:iam::\d{12}:role/[\w+=,.@-]+", assoc["roleArn"])


# -- the README's Deploy section ---------------------------------------------------------------------


def deploy_section() -> str:
    readme = (ROOT / "README.md").read_text()
    start = readme.index("\n## Deploy\n")
    end = readme.find("\n## ", start + 1)
    return readme[start:end if end != -1 else None]


def aws_commands(text: str) -> list[list[str]]:
    """Every `aws SERVICE OPERATION ...` in the text, also inside `$(...)`, as argument lists."""
    out = []
    for line in text.splitlines():
        for m in re.finditer(r"(?:^|\$\()\s*aws ([^)|\n]*)", line.strip()):
            out.append(shlex.split(m.group(1)))
    return out


def test_readme_aws_commands_use_real_operations_and_parameters() -> None:
    commands = aws_commands(deploy_section())
    assert len(commands) >= 8
    seen = set()
    for argv in commands:
        service, operation, *rest = argv
        shape = botocore_input(service, operation)
        params = {xform_name(m).replace("_", "-"): m for m in shape.members}
        given = {a for a in rest if a.startswith("--")}
        unknown = {a for a in given if a not in GLOBAL_OPTIONS and a[2:] not in params}
        assert not unknown, f"aws {service} {operation}: {unknown}"
        if "--cli-input-json" not in given:
            missing = {xform_name(m).replace("_", "-") for m in shape.required_members} - {a[2:] for a in given}
            assert not missing, f"aws {service} {operation} lacks {missing}"
        seen.add((service, operation))
    assert {("iam", "create-policy"), ("iam", "create-role"), ("iam", "attach-role-policy"),
            ("eks", "create-pod-identity-association"), ("eks", "describe-cluster")} <= seen


def test_readme_aws_commands_use_the_files_in_deploy_aws() -> None:
    section = deploy_section()
    for path in AWS.glob("*.json"):
        assert f"deploy/aws/{path.name}" in section, path.name
    for ref in re.findall(r"(?<![\w/])(deploy/[\w./-]+)", section):
        assert (ROOT / ref.rstrip(".")).exists(), ref


def test_readme_exports_every_variable_the_aws_files_use() -> None:
    section = deploy_section()
    exported = set(re.findall(r"\b([A-Z][A-Z0-9_]+)=", section))
    for path in AWS.glob("*.json"):
        wanted = set(re.findall(r"\$\{(\w+)\}", path.read_text()))
        assert wanted <= exported, (path.name, wanted - exported)
    assert set(SAMPLE) <= exported


def test_readme_deploy_section_says_which_port_serves_what() -> None:
    section = deploy_section()
    rows = {int(m.group(1)): m.group(0) for m in re.finditer(r"^\| (\d{4}) \|.*$", section, re.M)}
    assert {9400, 9201, 9202} <= set(rows)
    assert "127.0.0.1" in rows[9201] and "/api/v1/write" in rows[9201]
    for endpoint in ("/metrics", "/-/healthy", "/-/ready", "/api/v1/cardinality", "status page"):
        assert endpoint in rows[9202], endpoint
    assert "/ready" in rows[9400] and "/health" in rows[9400]


def test_readme_deploy_section_documents_amp_ha() -> None:
    section = deploy_section()
    assert "`__replica__: ${POD_NAME}`" in section and "`cluster: ${CLUSTER_NAME}`" in section
    assert "prometheus_replica" in section


def test_readme_names_every_kustomization() -> None:
    section = deploy_section()
    for k in DEPLOY.rglob("kustomization.yaml"):
        rel = k.parent.relative_to(ROOT)
        if len(rel.parts) <= 3:  # deploy/<base> and deploy/overlays/<overlay>, not their parts
            assert f"`{rel}`" in section, rel


def test_string_template_substitution_refuses_a_missing_variable(tmp_path: Path) -> None:
    with pytest.raises(KeyError):
        Template((AWS / "irsa-trust-policy.json").read_text()).substitute({"AWS_ACCOUNT_ID": "1"})
