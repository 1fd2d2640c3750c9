#!/usr/bin/env bash
# The README's test command as a fresh CPU machine runs it (CI's `bash .ci/run`): a fresh clone of
# this repository's HEAD, a new virtualenv, and new HOME, TMPDIR, pip and XDG cache directories,
# so no cache of any kind (XLA's, pip's, libtpu's, compiled bytecode) is carried over. Runs
# .ci/run there with pytest's --durations=50 and prints the install's and the suite's wall time,
# pytest's result line and the 20 slowest tests; the whole log is kept in $LOG (default
# /tmp/fresh_suite.log). Usage: bash scripts/fresh_suite.sh  (KEEP=1 keeps the work directory)
set -uo pipefail
repo=$(git -C "$(dirname "$0")/.." rev-parse --show-toplevel)
work=$(mktemp -d /tmp/jaxserve-fresh-XXXXXX)
LOG=${LOG:-/tmp/fresh_suite.log}
git clone -q "$repo" "$work/src" && git -C "$work/src" log --oneline -1
python3 -m venv "$work/venv"
mkdir -p "$work/home" "$work/tmp" "$work/cache"
export HOME=$work/home TMPDIR=$work/tmp XDG_CACHE_HOME=$work/cache PIP_CACHE_DIR=$work/cache/pip
export PATH=$work/venv/bin:$PATH VIRTUAL_ENV=$work/venv CI=true
export PYTEST_ADDOPTS="--durations=50 ${PYTEST_ADDOPTS:-}"
echo "machine: $(nproc) cores, $(free -g | awk '/Mem:/ {print $2}') GiB, $(lscpu | sed -n 's/Model name: *//p')"
start=$(date +%s)
(cd "$work/src" && bash .ci/run) > "$LOG" 2>&1 < /dev/null
rc=$?
end=$(date +%s)
echo "rc=$rc, wall $(( (end - start) / 60 )) min $(( (end - start) % 60 )) s (install, lint and tests; log: $LOG)"
grep -E "installed in [0-9]+ s" "$LOG"; grep -E "[0-9]+ passed" "$LOG" | tail -n 1
grep -E "^FAILED|^ERROR" "$LOG" | head -n 20
echo "the 20 slowest tests:"
sed -n '/slowest 50 durations/,/^$/p' "$LOG" | sed -n '2,21p'
[ -n "${KEEP:-}" ] || rm -rf "$work"
exit $rc
