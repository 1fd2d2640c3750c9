#!/usr/bin/env bash
# Launches jaxserve on a Cloud TPU VM (one host or a multi-host slice) and prints its endpoint.
#
#   scripts/launch_tpu_vm.sh --name NAME --zone ZONE --accelerator-type TYPE [options]
#   scripts/launch_tpu_vm.sh --name NAME --zone ZONE --delete [--queued]
#
# Steps: create the TPU VM (`gcloud compute tpus tpu-vm create`, or a queued resource with
# --queued, waited on until ACTIVE), copy this checkout to every worker (`tpu-vm scp
# --worker=all`) and install it with jax[tpu] (`tpu-vm ssh --worker=all`), run an optional
# --setup command on every worker (e.g. fetch the checkpoint), start `jaxserve serve` on every
# worker (multi-host slices add --distributed: JAX finds the slice's hosts, worker 0 serves HTTP
# and the others follow its steps), wait until worker 0 answers /health, print the endpoint.
#
# Options:
#   --project P            passed to every gcloud call
#   --version RUNTIME      TPU software version (default by type: v5litepod/v5e v2-alpha-tpuv5-lite,
#                          v6e v2-alpha-tpuv6e, v5p v2-alpha-tpuv5, v4 tpu-ubuntu2204-base)
#   --spot | --reserved    provisioning model
#   --queued               create through the queued resources API (recommended for capacity)
#   --model M              checkpoint path on the workers or tiny-random (default tiny-random)
#   --config FILE          jaxserve config (default by type: configs/v5e-8.yaml, configs/v6e-8.yaml)
#   --port N               HTTP port of worker 0 (default 8000)
#   --setup CMD            shell command run on every worker before serving
#   --skip-create          reuse an existing TPU VM; --skip-install: reuse the installed checkout
#   --no-wait              do not wait for /health
#   --health-timeout S     seconds to wait for /health (default 1800)
#   --dry-run              print every gcloud command instead of running it
#   --delete               delete the TPU VM (or the queued resource and its VM) and exit
set -Eeuo pipefail

die() { echo "launch_tpu_vm.sh: error: $*" >&2; exit 2; }
trap 'rc=$?; echo "launch_tpu_vm.sh: error: command failed with exit status $rc: $BASH_COMMAND" >&2' ERR

NAME="" ZONE="" TYPE="" PROJECT="" VERSION="" PROVISIONING="" QUEUED=0 MODEL="tiny-random"
CONFIG="" PORT=8000 SETUP="" SKIP_CREATE=0 SKIP_INSTALL=0 WAIT=1 HEALTH_TIMEOUT=1800
DRY_RUN=0 DELETE=0 REMOTE_DIR="jaxserve"

while [[ $# -gt 0 ]]; do
  case "$1" in
    --name) NAME="$2"; shift 2 ;;
    --zone) ZONE="$2"; shift 2 ;;
    --accelerator-type) TYPE="$2"; shift 2 ;;
    --project) PROJECT="$2"; shift 2 ;;
    --version) VERSION="$2"; shift 2 ;;
    --spot) PROVISIONING="--spot"; shift ;;
    --reserved) PROVISIONING="--reserved"; shift ;;
    --queued) QUEUED=1; shift ;;
    --model) MODEL="$2"; shift 2 ;;
    --config) CONFIG="$2"; shift 2 ;;
    --port) PORT="$2"; shift 2 ;;
    --setup) SETUP="$2"; shift 2 ;;
    --skip-create) SKIP_CREATE=1; shift ;;
    --skip-install) SKIP_INSTALL=1; shift ;;
    --no-wait) WAIT=0; shift ;;
    --health-timeout) HEALTH_TIMEOUT="$2"; shift 2 ;;
    --dry-run) DRY_RUN=1; shift ;;
    --delete) DELETE=1; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument: $1 (see --help)" ;;
  esac
done
[[ -n "$NAME" ]] || die "--name is required"
[[ -n "$ZONE" ]] || die "--zone is required"

COMMON=(--zone="$ZONE")
[[ -n "$PROJECT" ]] && COMMON+=(--project="$PROJECT")

# gcloud ARGS...: runs gcloud, or prints the command under --dry-run.
gc() {
  if [[ $DRY_RUN == 1 ]]; then
    printf 'gcloud'; printf ' %q' "$@"; printf '\n'
  else
    gcloud "$@"
  fi
}

# wait_for_state WANTED FAILED_STATES DESCRIBE_ARGS...: polls a describe call until WANTED.
wait_for_state() {
  local wanted="$1" failed="$2" state; shift 2
  if [[ $DRY_RUN == 1 ]]; then gc "$@"; return; fi
  while true; do
    state="$(gcloud "$@")"
    [[ "$state" == "$wanted" ]] && return
    [[ " $failed " == *" $state "* ]] && die "$NAME is in state $state (wanted $wanted)"
    echo "waiting for $NAME: state ${state:-unknown}" >&2
    sleep 15
  done
}

if [[ $DELETE == 1 ]]; then
  if [[ $QUEUED == 1 ]]; then
    gc compute tpus queued-resources delete "$NAME" "${COMMON[@]}" --force --quiet
  else
    gc compute tpus tpu-vm delete "$NAME" "${COMMON[@]}" --quiet
  fi
  echo "deleted $NAME"
  exit 0
fi

[[ -n "$TYPE" ]] || die "--accelerator-type is required (e.g. v5litepod-8, v6e-8, v5litepod-16)"
[[ "$TYPE" =~ ^(v[0-9]+[a-z]*)-([0-9]+)$ ]] || die "--accelerator-type: expected NAME-SIZE, got $TYPE"
FAMILY="${BASH_REMATCH[1]}" SIZE="${BASH_REMATCH[2]}"
case "$FAMILY" in
  v5litepod|v5e) DEFAULT_VERSION=v2-alpha-tpuv5-lite CHIPS=$SIZE CHIPS_PER_HOST=8 DEFAULT_CONFIG=configs/v5e-8.yaml ;;
  v6e) DEFAULT_VERSION=v2-alpha-tpuv6e CHIPS=$SIZE CHIPS_PER_HOST=8 DEFAULT_CONFIG=configs/v6e-8.yaml ;;
  v5p) DEFAULT_VERSION=v2-alpha-tpuv5 CHIPS=$((SIZE / 2)) CHIPS_PER_HOST=4 DEFAULT_CONFIG="" ;;
  v4) DEFAULT_VERSION=tpu-ubuntu2204-base CHIPS=$((SIZE / 2)) CHIPS_PER_HOST=4 DEFAULT_CONFIG="" ;;
  *) die "--accelerator-type: unsupported TPU family $FAMILY (v4, v5p, v5litepod/v5e, v6e)" ;;
esac
VERSION="${VERSION:-$DEFAULT_VERSION}"
CONFIG="${CONFIG:-$DEFAULT_CONFIG}"
MULTI_HOST=0
(( CHIPS > CHIPS_PER_HOST )) && MULTI_HOST=1

# 1. The TPU VM.
if [[ $SKIP_CREATE == 0 ]]; then
  if [[ $QUEUED == 1 ]]; then
    gc compute tpus queued-resources create "$NAME" --node-id="$NAME" "${COMMON[@]}" \
      --accelerator-type="$TYPE" --runtime-version="$VERSION" ${PROVISIONING:+"$PROVISIONING"}
    wait_for_state ACTIVE "FAILED SUSPENDED" compute tpus queued-resources describe "$NAME" \
      "${COMMON[@]}" --format='value(state.state)'
  else
    gc compute tpus tpu-vm create "$NAME" "${COMMON[@]}" --accelerator-type="$TYPE" \
      --version="$VERSION" ${PROVISIONING:+"$PROVISIONING"}
  fi
  wait_for_state READY "STOPPED PREEMPTED TERMINATED" compute tpus tpu-vm describe "$NAME" \
    "${COMMON[@]}" --format='value(state)'
fi

# 2. This checkout on every worker, installed with jax[tpu].
if [[ $SKIP_INSTALL == 0 ]]; then
  REPO="$(cd "$(dirname "$0")/.." && pwd)"
  if [[ $DRY_RUN == 1 ]]; then
    ARCHIVE="/tmp/jaxserve.XXXXXX/jaxserve.tar.gz"
    echo "git -C $REPO archive --format=tar.gz -o $ARCHIVE HEAD"
  else
    ARCHIVE_DIR="$(mktemp -d)"
    trap 'rm -rf "$ARCHIVE_DIR"' EXIT
    ARCHIVE="$ARCHIVE_DIR/jaxserve.tar.gz"
    git -C "$REPO" archive --format=tar.gz -o "$ARCHIVE" HEAD
  fi
  gc compute tpus tpu-vm scp "$ARCHIVE" "$NAME":jaxserve.tar.gz "${COMMON[@]}" --worker=all
  gc compute tpus tpu-vm ssh "$NAME" "${COMMON[@]}" --worker=all --command="rm -rf ~/$REMOTE_DIR \
&& mkdir -p ~/$REMOTE_DIR && tar -xzf ~/jaxserve.tar.gz -C ~/$REMOTE_DIR \
&& pip install -q -U 'jax[tpu]' && pip install -q -e ~/$REMOTE_DIR"
fi
[[ -n "$SETUP" ]] && gc compute tpus tpu-vm ssh "$NAME" "${COMMON[@]}" --worker=all --command="$SETUP"

# 3. The server on every worker; worker 0 serves HTTP.
SERVE="python3 -m jaxserve.cli serve --model $MODEL --tensor-parallel-size $CHIPS --host 0.0.0.0 --port $PORT"
[[ -n "$CONFIG" ]] && SERVE+=" --config ~/$REMOTE_DIR/$CONFIG"
[[ $MULTI_HOST == 1 ]] && SERVE+=" --distributed"
gc compute tpus tpu-vm ssh "$NAME" "${COMMON[@]}" --worker=all --command="cd ~/$REMOTE_DIR \
&& { [ ! -f ~/jaxserve.pid ] || kill \$(cat ~/jaxserve.pid) 2> /dev/null || true; } \
&& { setsid nohup $SERVE > ~/jaxserve.log 2>&1 < /dev/null & echo \$! > ~/jaxserve.pid; }"

# 4. Ready when worker 0 answers /health (checked on the VM, so no firewall rule is needed).
if [[ $WAIT == 1 ]]; then
  if [[ $DRY_RUN == 1 ]]; then
    gc compute tpus tpu-vm ssh "$NAME" "${COMMON[@]}" --worker=0 \
      --command="curl -sf http://localhost:$PORT/health"
  else
    deadline=$((SECONDS + HEALTH_TIMEOUT))
    until gcloud compute tpus tpu-vm ssh "$NAME" "${COMMON[@]}" --worker=0 \
        --command="curl -sf http://localhost:$PORT/health" > /dev/null 2>&1; do
      (( SECONDS < deadline )) || die "$NAME: no /health within $HEALTH_TIMEOUT s; see ~/jaxserve.log on the workers"
      echo "waiting for /health on worker 0 (model load and warmup)" >&2
      sleep 20
    done
  fi
fi
DESCRIBE_IP=(compute tpus tpu-vm describe "$NAME" "${COMMON[@]}"
  --format='value(networkEndpoints[0].accessConfig.externalIp)')
if [[ $DRY_RUN == 1 ]]; then
  gc "${DESCRIBE_IP[@]}"
  IP="EXTERNAL_IP"
else
  IP="$(gcloud "${DESCRIBE_IP[@]}")"
fi
echo "jaxserve on $NAME ($TYPE, $CHIPS chips, tensor_parallel_size $CHIPS): http://$IP:$PORT"
echo "  (open port $PORT in a firewall rule, or tunnel: gcloud compute tpus tpu-vm ssh $NAME --zone=$ZONE -- -L $PORT:localhost:$PORT)"
