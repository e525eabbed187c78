"""The Helm chart (deploy/helm/reval-stream), checked by the tools its users run: ``helm lint``
and ``helm template`` with the default values and with a production values file, every
rendered manifest validated against the Kubernetes schemas (``kubernetes-validate``), the
custom resources (KEDA, Prometheus Operator, Strimzi) against their documented fields, the
PrometheusRule equal to deploy/prometheus/rules.yml and passing ``promtool test rules``, the
workers' settings against workers/settings.py, and bad values refused with one clear line.

Helm comes from the Go module proxy (.ci/services.sh: ``go install helm.sh/helm/v3/cmd/helm``).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from stream.monitoring.alert_params import RUNBOOK
from workers.service.app import DEFAULT_PORTS
from workers.service.incarnation import batch_group
from workers.settings import Settings

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "deploy" / "helm" / "reval-stream"
PRODUCTION = CHART / "ci" / "production-values.yaml"
KUBE_VERSION = "1.31.0"


@cache
def helm() -> str:
    found = shutil.which("helm")
    if found is None:
        gopath = subprocess.run(["go", "env", "GOPATH"], capture_output=True, text=True).stdout.strip()
        candidate = Path(gopath or "~/go").expanduser() / "bin" / "helm"
        found = str(candidate) if candidate.exists() else None
    if found is None:
        pytest.fail(
            "helm is not installed: `make services` installs it (go install helm.sh/helm/v3/cmd/helm)"
        )
    return found


def run_helm(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([helm(), *args], capture_output=True, text=True, timeout=120, cwd=ROOT)


def template(*args: str) -> list[dict[str, Any]]:
    done = run_helm("template", "demo", str(CHART), "--kube-version", KUBE_VERSION, *args)
    assert done.returncode == 0, done.stderr
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


@cache
def rendered(values: str | None = None) -> tuple[dict[str, Any], ...]:
    return tuple(template(*(["-f", values] if values else [])))


def kinds(docs: tuple[dict[str, Any], ...], kind: str) -> list[dict[str, Any]]:
    return [doc for doc in docs if doc["kind"] == kind]


def by_role(docs: tuple[dict[str, Any], ...], kind: str) -> dict[str, dict[str, Any]]:
    return {doc["metadata"]["labels"]["app.kubernetes.io/component"]: doc for doc in kinds(docs, kind)}


VALUES = [None, str(PRODUCTION)]


@pytest.mark.parametrize("values", VALUES, ids=["default", "production"])
def test_helm_lint_is_clean(values: str | None) -> None:
    args = ["lint", str(CHART), "--strict", "--kube-version", KUBE_VERSION]
    done = run_helm(*args, *(["-f", values] if values else []))
    assert done.returncode == 0 and "0 chart(s) failed" in done.stdout, done.stdout + done.stderr


# The custom resources' fields as their projects document them (KEDA 2.x ScaledObject and
# TriggerAuthentication, Prometheus Operator v1 PodMonitor and PrometheusRule, Strimzi v1beta2
# KafkaTopic), restricted to what the chart may set: an unknown or misspelt field fails.
def _obj(properties: dict[str, Any], required: tuple[str, ...] = ()) -> dict[str, Any]:
    return {
        "type": "object",
        "additionalProperties": False,
        "properties": properties,
        "required": list(required),
    }


_STR = {"type": "string"}
_INT = {"type": "integer"}
_LABELS = {"type": "object", "additionalProperties": _STR}
_META = _obj({"name": _STR, "labels": _LABELS, "annotations": _LABELS}, ("name",))
CRD_SCHEMAS: dict[tuple[str, str], dict[str, Any]] = {
    ("keda.sh/v1alpha1", "ScaledObject"): _obj(
        {
            "apiVersion": _STR,
            "kind": _STR,
            "metadata": _META,
            "spec": _obj(
                {
                    "scaleTargetRef": _obj({"name": _STR, "kind": _STR, "apiVersion": _STR}, ("name",)),
                    "minReplicaCount": _INT,
                    "maxReplicaCount": _INT,
                    "pollingInterval": _INT,
                    "cooldownPeriod": _INT,
                    "advanced": _obj(
                        {
                            "horizontalPodAutoscalerConfig": _obj(
                                {"behavior": {"type": "object"}, "name": _STR}
                            ),
                            "restoreToOriginalReplicaCount": {"type": "boolean"},
                        }
                    ),
                    "triggers": {
                        "type": "array",
                        "minItems": 1,
                        "items": _obj(
                            {
                                "type": {"enum": ["kafka"]},
                                "metadata": _obj(
                                    {
                                        name: _STR
                                        for name in [
                                            "bootstrapServers",
                                            "consumerGroup",
                                            "topic",
                                            "lagThreshold",
                                            "activationLagThreshold",
                                            "offsetResetPolicy",
                                            "allowIdleConsumers",
                                            "scaleToZeroOnInvalidOffset",
                                            "excludePersistentLag",
                                            "sasl",
                                            "tls",
                                        ]
                                    },
                                    ("bootstrapServers", "consumerGroup"),
                                ),
                                "authenticationRef": _obj({"name": _STR}, ("name",)),
                            },
                            ("type", "metadata"),
                        ),
                    },
                },
                ("scaleTargetRef", "triggers"),
            ),
        },
        ("apiVersion", "kind", "metadata", "spec"),
    ),
    ("keda.sh/v1alpha1", "TriggerAuthentication"): _obj(
        {
            "apiVersion": _STR,
            "kind": _STR,
            "metadata": _META,
            "spec": _obj(
                {
                    "secretTargetRef": {
                        "type": "array",
                        "items": _obj(
                            {"parameter": _STR, "name": _STR, "key": _STR}, ("parameter", "name", "key")
                        ),
                    },
                    "env": {
                        "type": "array",
                        "items": _obj(
                            {"parameter": _STR, "name": _STR, "containerName": _STR}, ("parameter", "name")
                        ),
                    },
                }
            ),
        },
        ("apiVersion", "kind", "metadata", "spec"),
    ),
    ("monitoring.coreos.com/v1", "PodMonitor"): _obj(
        {
            "apiVersion": _STR,
            "kind": _STR,
            "metadata": _META,
            "spec": _obj(
                {
                    "selector": _obj({"matchLabels": _LABELS}),
                    "jobLabel": _STR,
                    "podMetricsEndpoints": {
                        "type": "array",
                        "items": _obj(
                            {
                                "port": _STR,
                                "path": _STR,
                                "interval": _STR,
                                "relabelings": {
                                    "type": "array",
                                    "items": _obj(
                                        {
                                            "sourceLabels": {"type": "array", "items": _STR},
                                            "targetLabel": _STR,
                                            "replacement": _STR,
                                            "regex": _STR,
                                            "action": _STR,
                                        }
                                    ),
                                },
                            }
                        ),
                    },
                },
                ("selector", "podMetricsEndpoints"),
            ),
        },
        ("apiVersion", "kind", "metadata", "spec"),
    ),
    ("monitoring.coreos.com/v1", "PrometheusRule"): _obj(
        {
            "apiVersion": _STR,
            "kind": _STR,
            "metadata": _META,
            "spec": _obj(
                {
                    "groups": {
                        "type": "array",
                        "items": _obj(
                            {
                                "name": _STR,
                                "interval": _STR,
                                "rules": {
                                    "type": "array",
                                    "items": _obj(
                                        {
                                            "record": _STR,
                                            "alert": _STR,
                                            "expr": _STR,
                                            "for": _STR,
                                            "keep_firing_for": _STR,
                                            "labels": _LABELS,
                                            "annotations": _LABELS,
                                        },
                                        ("expr",),
                                    ),
                                },
                            },
                            ("name", "rules"),
                        ),
                    }
                },
                ("groups",),
            ),
        },
        ("apiVersion", "kind", "metadata", "spec"),
    ),
    ("kafka.strimzi.io/v1beta2", "KafkaTopic"): _obj(
        {
            "apiVersion": _STR,
            "kind": _STR,
            "metadata": _META,
            "spec": _obj(
                {
                    "topicName": _STR,
                    "partitions": {"type": "integer", "minimum": 1},
                    "replicas": {"type": "integer", "minimum": 1, "maximum": 32767},
                    "config": {"type": "object"},
                }
            ),
        },
        ("apiVersion", "kind", "metadata", "spec"),
    ),
}


@pytest.mark.parametrize("values", VALUES, ids=["default", "production"])
def test_every_manifest_is_valid_against_its_schema(values: str | None) -> None:
    docs = rendered(values)
    seen = set()
    for doc in docs:
        key = (doc["apiVersion"], doc["kind"])
        seen.add(doc["kind"])
        if key in CRD_SCHEMAS:
            jsonschema.validate(doc, CRD_SCHEMAS[key])
        else:  # the Kubernetes API's own OpenAPI schemas, bundled by kubernetes-validate
            kubernetes_validate.validate(doc, KUBE_VERSION.rsplit(".", 1)[0], strict=True)
    assert {"Deployment", "PersistentVolumeClaim", "PodMonitor", "PrometheusRule", "ConfigMap"} <= seen
    if values:
        assert {"ScaledObject", "TriggerAuthentication", "KafkaTopic"} <= seen


def test_the_crd_schemas_catch_a_misspelt_field() -> None:
    """The hand-written CRD schemas above are not vacuous."""
    scaled = json.loads(json.dumps(kinds(rendered(str(PRODUCTION)), "ScaledObject")[0]))
    scaled["spec"]["maxReplicas"] = 3
    with pytest.raises(jsonschema.ValidationError, match="maxReplicas"):
        jsonschema.validate(scaled, CRD_SCHEMAS[("keda.sh/v1alpha1", "ScaledObject")])


def test_the_prometheus_rule_is_the_deployed_rules_and_passes_their_unit_tests(tmp_path: Path) -> None:
    (rule,) = kinds(rendered(), "PrometheusRule")
    deployed = yaml.safe_load((ROOT / "deploy" / "prometheus" / "rules.yml").read_text())
    assert rule["spec"] == {"groups": deployed["groups"]}
    # promtool runs the deployed rules' unit tests on the rules as the chart ships them
    (tmp_path / "chart-rules.yml").write_text(yaml.safe_dump(rule["spec"]))
    tests = yaml.safe_load((ROOT / "deploy" / "prometheus" / "tests" / "rules_test.yml").read_text())
    tests["rule_files"] = ["chart-rules.yml"]
    (tmp_path / "rules_test.yml").write_text(yaml.safe_dump(tests, sort_keys=False))
    promtool = shutil.which("promtool")
    assert promtool, "promtool missing: `make services` installs it (Debian prometheus)"
    done = subprocess.run(
        [promtool, "test", "rules", "rules_test.yml"], cwd=tmp_path, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr
    for group in rule["spec"]["groups"]:
        for alert in (r for r in group["rules"] if "alert" in r):
            assert RUNBOOK in alert["annotations"]["runbook_url"], alert["alert"]


def test_dashboard_config_map_is_the_dashboard() -> None:
    (config_map,) = kinds(rendered(), "ConfigMap")
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    shipped = json.loads(config_map["data"]["reval-stream.json"])
    assert shipped == json.loads(
        (ROOT / "deploy" / "grafana" / "dashboards" / "reval-stream.json").read_text()
    )


@pytest.mark.parametrize("values", VALUES, ids=["default", "production"])
def test_workers_settings_and_security(values: str | None) -> None:
    docs = rendered(values)
    fields = {f"REVAL_{name.upper()}" for name in Settings.model_fields}
    deployments = by_role(docs, "Deployment")
    assert set(deployments) == {"embed", "index", "score"}
    for role, deployment in deployments.items():
        pod = deployment["spec"]["template"]["spec"]
        (container,) = pod["containers"]
        assert container["args"] == ["reval", "worker", role]
        env = {item["name"]: item for item in container["env"]}
        unknown = {name for name in env if name.startswith("REVAL_")} - fields
        assert not unknown, f"{role}: settings workers/settings.py does not know: {unknown}"
        assert env["REVAL_METRICS_PORT"]["value"] == str(DEFAULT_PORTS[role])
        assert container["ports"][0]["containerPort"] == DEFAULT_PORTS[role]
        # secrets reach the pod from Secrets only
        for name in ("REVAL_KAFKA_SASL_PASSWORD",):
            assert name not in env or "secretKeyRef" in env[name]["valueFrom"], name
        # every setting value parses as Settings would read it
        plain = {
            k[len("REVAL_") :].lower(): v["value"]
            for k, v in env.items()
            if k.startswith("REVAL_") and "value" in v
        }
        Settings.load(**plain)
        # non-root, no privilege escalation, read-only root filesystem
        assert pod["securityContext"]["runAsNonRoot"] is True
        security = container["securityContext"]
        assert security["readOnlyRootFilesystem"] is True and security["allowPrivilegeEscalation"] is False
        assert security["capabilities"]["drop"] == ["ALL"]
        mounts = {m["mountPath"] for m in container["volumeMounts"]}
        assert {"/tmp", env["REVAL_DATA_DIR"]["value"]} <= mounts
    assert "REVAL_INDEX_DIR" in {
        e["name"] for e in deployments["index"]["spec"]["template"]["spec"]["containers"][0]["env"]
    }
    index_mounts = deployments["index"]["spec"]["template"]["spec"]["containers"][0]["volumeMounts"]
    assert any(m["mountPath"] == "/var/lib/reval/thesaurus" for m in index_mounts)


def test_production_values_use_secrets_gpu_and_autoscaling_within_the_partitions() -> None:
    docs = rendered(str(PRODUCTION))
    values = yaml.safe_load(PRODUCTION.read_text())
    partitions = values["kafka"]["partitions"]
    deployments = by_role(docs, "Deployment")
    embed = deployments["embed"]["spec"]["template"]["spec"]["containers"][0]
    assert embed["resources"]["limits"]["nvidia.com/gpu"] == 1
    env = {item["name"]: item for item in embed["env"]}
    assert env["REVAL_KAFKA_SASL_PASSWORD"]["valueFrom"]["secretKeyRef"]["name"] == "reval-kafka"
    assert env["REVAL_REDIS_URL"]["valueFrom"]["secretKeyRef"]["name"] == "reval-redis"
    scaled = by_role(docs, "ScaledObject")
    assert set(scaled) == {"embed", "score"}
    settings = Settings.load()
    groups = {role: batch_group(settings.app_id, role, 0) for role in ("embed", "score")}
    topics = {"embed": settings.topic_tweets, "score": settings.topic_recommendations}
    for role, obj in scaled.items():
        spec = obj["spec"]
        assert spec["maxReplicaCount"] <= partitions
        assert spec["scaleTargetRef"]["name"] == deployments[role]["metadata"]["name"]
        assert "replicas" not in deployments[role]["spec"], "KEDA owns the replica count"
        assert (
            spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]["scaleDown"][
                "stabilizationWindowSeconds"
            ]
            >= 300
        )
        (trigger,) = spec["triggers"]
        assert trigger["metadata"]["consumerGroup"] == groups[role]
        assert trigger["metadata"]["topic"] == topics[role]
        assert trigger["metadata"]["allowIdleConsumers"] == "false"
    # the Strimzi topics are the ones the workers declare, with their counts and retention
    expected = Settings.load(partitions=partitions, input_retention_ms=values["kafka"]["inputRetentionMs"])
    topics_made = {t["spec"]["topicName"]: t["spec"] for t in kinds(docs, "KafkaTopic")}
    assert {name: spec["partitions"] for name, spec in topics_made.items()} == {
        **expected.topics(),
        expected.topic_votes: 1,
    }
    assert all(spec["replicas"] == values["kafka"]["replication"] for spec in topics_made.values())
    for name, config in expected.topic_configs().items():
        assert topics_made[name]["config"] == config


BAD_VALUES = {
    "negative replicas": (["--set", "roles.score.replicas=-1"], "/roles/score/replicas"),
    "an unknown role": (["--set", "roles.indexer.replicas=1"], "'indexer' not allowed"),
    "a password in values": (
        ["--set", "settings.REVAL_KAFKA_SASL_PASSWORD=hunter2"],
        "settings.REVAL_KAFKA_SASL_PASSWORD: a secret in values is refused",
    ),
    # ...and a token, but not REVAL_TOKEN_BUDGET or REVAL_TOKENIZE_WORKERS (production values)
    "a token in values": (
        ["--set", "roles.score.settings.REVAL_AUDIT_TOKEN=abc"],
        "roles.score.settings.REVAL_AUDIT_TOKEN: a secret in values is refused",
    ),
    "a password in the Redis URL": (
        ["--set", "redis.url=redis://app:hunter2@redis:6379/0"],
        "redis.url holds credentials",
    ),
    "more workers than partitions": (
        ["--set", "roles.score.autoscaling.enabled=true", "--set", "roles.score.autoscaling.maxReplicas=8"],
        "roles.score.autoscaling.maxReplicas=8 exceeds kafka.partitions=4",
    ),
    "a setting the chart owns": (
        ["--set", "settings.REVAL_BROKER=x:9092"],
        "set by the chart from kafka.bootstrapServers",
    ),
    "SASL without a secret": (
        ["--set", "kafka.securityProtocol=SASL_SSL"],
        "needs kafka.sasl.passwordSecret.name",
    ),
    "an unknown setting name": (["--set", "settings.broker=x"], "'broker' does not match pattern '^REVAL_"),
}


@pytest.mark.parametrize("case", sorted(BAD_VALUES))
def test_bad_values_are_refused_with_one_clear_line(case: str) -> None:
    args, message = BAD_VALUES[case]
    done = run_helm("template", "demo", str(CHART), "--kube-version", KUBE_VERSION, *args)
    assert done.returncode != 0
    lines = [line for line in done.stderr.splitlines() if message in line]
    assert len(lines) == 1, done.stderr
    assert "hunter2" not in done.stderr, "a refusal never echoes the secret"


def test_the_chart_documents_what_it_was_not_run_on() -> None:
    readme = (ROOT / "deploy" / "README.md").read_text()
    assert "helm install" in readme and "never installed" in readme.lower()
    assert os.path.islink(CHART / "files" / "rules.yml"), "the chart ships deploy/prometheus/rules.yml itself"
