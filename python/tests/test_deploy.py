"""The Kubernetes base (deploy/k8s): every object valid against the Kubernetes API schemas,
and every container's command one that docs/kubernetes.md lists (which the CLI's test parses)."""

import os
import pathlib
import re
import shutil
import subprocess

import pytest

import yaml  # noqa: E402  (the test extra installs it)
import kubernetes_validate as kv  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parents[2]
K8S = REPO / "deploy" / "k8s"


def objects():
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    for name in kustomization["resources"]:
        for doc in yaml.safe_load_all((K8S / name).read_text()):
            if doc:
                yield name, doc


def test_the_kustomization_lists_every_manifest():
    listed = set(yaml.safe_load((K8S / "kustomization.yaml").read_text())["resources"])
    present = {p.name for p in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert listed == present


def test_every_object_is_valid_against_the_kubernetes_api_schemas():
    version = kv.utils.latest_version()
    seen = set()
    for name, doc in objects():
        kv.validate(doc, version, strict=True)
        seen.add(doc["kind"])
    assert {"ConfigMap", "Secret", "Service", "StatefulSet", "Job"} <= seen


def test_a_broken_object_is_refused_by_the_validator():
    bad = {"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": "x"}, "spec": {"replicas": "two"}}
    with pytest.raises(Exception):
        kv.validate(bad, kv.utils.latest_version(), strict=True)


def test_every_container_runs_a_command_the_docs_list():
    config = {}
    for _, doc in objects():
        if doc["kind"] == "ConfigMap":
            config.update(doc["data"])
    env = dict(config, POD_NAME="downpour-server-0", POD_NAMESPACE="ml")
    documented = set()
    for block in re.findall(r"```sh\n(.*?)```", (REPO / "docs" / "kubernetes.md").read_text(), re.S):
        documented.update(line.strip() for line in block.splitlines() if line.startswith("downpour "))
    commands = 0
    for _, doc in objects():
        if doc["kind"] not in ("StatefulSet", "Job", "Deployment"):
            continue
        for c in doc["spec"]["template"]["spec"]["containers"]:
            args = [re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], a) for a in c["args"]]
            line = "downpour " + " ".join(args)
            assert line in documented, f"{c['name']}: {line}"
            commands += 1
            # a preStop hook's downpour command, its shell variables expanded
            hook = c.get("lifecycle", {}).get("preStop", {}).get("exec", {}).get("command", [])
            if hook:
                script = re.sub(r"\$(\w+)", lambda m: env[m.group(1)], hook[-1]).replace('"', "")
                drain = re.match(r"(downpour admin drain [^&]*?)\s*&&", script)
                assert drain and drain.group(1) in documented, f"{c['name']}'s preStop: {script}"
                commands += 1
    assert commands == 4


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("ip") is None, reason="network namespaces need root and iproute2")
def test_the_pods_commands_ride_out_a_pod_replacement_a_scale_up_and_a_scale_down():
    binary = REPO / "target" / "release" / "downpour"
    if not binary.exists():
        pytest.skip("no release build (cargo build --release)")
    r = subprocess.run(["bash", str(REPO / "scripts" / "k8s_rehearsal.sh")], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "both workers' counters exact" in r.stdout
