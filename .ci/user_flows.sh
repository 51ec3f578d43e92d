#!/usr/bin/env bash
# What a user does, from the project's own files, in fresh virtual environments (plain `python -m venv`:
# nothing from this machine's site-packages; the core dependencies come from PyPI, no extra):
#   1. `make demo` in a checkout: the recommendation, its ds_config.json and its launch line;
#   2. the wheel, built from a clean copy of the source, installed elsewhere and run from a folder
#      outside the checkout: recommend and predict with each shipped profile, and the one-line
#      answers of what the wheel alone cannot do.
# An editable install hides missing package data and undeclared imports; this does not.
# Fails at the first check that fails. Run it alone: .ci/user_flows.sh
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PYTHON=${PYTHON:-python3}
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ROOT_USER_ACTION=ignore
unset PYTHONPATH PYTHONHOME  # a checkout on the path would stand in for the installed wheel
PROFILES=(gh200 h100 h200)
GPU_MODULES="torch deepspeed psutil pynvml"

fail() { echo "user flows: FAILED: $*" >&2; exit 1; }

# Run a command; it must exit 0 and print no traceback. Its stdout is left in $WORK/out, stderr in $WORK/err.
clean_run() {
    echo "+ $*"
    local rc=0
    "$@" >"$WORK/out" 2>"$WORK/err" || rc=$?
    [ "$rc" = 0 ] || { tail -n 40 "$WORK/out" "$WORK/err"; fail "$* (exit $rc)"; }
    ! grep -q Traceback "$WORK/out" "$WORK/err" || { cat "$WORK/out" "$WORK/err"; fail "$*: traceback"; }
}

# The output (stdout and stderr) of the last command must hold each of the given strings.
holds() {
    for s in "$@"; do
        grep -qF -- "$s" "$WORK/out" "$WORK/err" || { tail -n 40 "$WORK/out" "$WORK/err"; fail "no '$s' in the output"; }
    done
}

# A command that cannot work here must fail with one line naming the way out, not a traceback.
one_line_refusal() {
    local want=$1; shift
    echo "+ $* (must refuse in one line)"
    if "$@" >"$WORK/out" 2>"$WORK/err"; then cat "$WORK/out" "$WORK/err"; fail "$*: succeeded"; fi
    [ "$(cat "$WORK/out" "$WORK/err" | grep -c .)" = 1 ] || { cat "$WORK/out" "$WORK/err"; fail "$*: not one line"; }
    holds "$want"
    sed 's/^/  -> /' "$WORK/out" "$WORK/err"
}

# Without the gpu extra, none of its modules may be importable in the venv (else the checks prove nothing).
no_gpu_extra() {
    "$1" -c "import importlib.util, sys; found = [m for m in sys.argv[1:] if importlib.util.find_spec(m)]; \
sys.exit(f'gpu extra modules installed: {found}' if found else 0)" $GPU_MODULES
}

start=$SECONDS
echo "== make demo in a fresh venv"
"$PYTHON" -m venv "$WORK/demo"
clean_run make demo PYTHON="$WORK/demo/bin/python"
holds "Recommended (*):" "ds_config.json" '"zero_optimization"' "Launch" "deepspeed --num_gpus"
sed -n '/^Recommended/,$p' "$WORK/out"
no_gpu_extra "$WORK/demo/bin/python"
echo "   ok ($((SECONDS - start)) s)"

start=$SECONDS
echo "== the wheel, installed in a fresh venv, run outside the checkout"
# setuptools builds in place: a copy of the tracked and new files keeps an old build/ out of the wheel.
mkdir "$WORK/source"
git ls-files --cached --others --exclude-standard -z \
    | while IFS= read -r -d '' f; do if [ -f "$f" ]; then printf '%s\0' "$f"; fi; done \
    | tar --null -T - -cf - | tar -C "$WORK/source" -xf -
clean_run "$PYTHON" -m pip wheel --no-deps --wheel-dir "$WORK/dist" "$WORK/source"
"$PYTHON" -m venv "$WORK/user"
clean_run "$WORK/user/bin/python" -m pip install "$WORK/dist"/energy_advisor-*.whl
no_gpu_extra "$WORK/user/bin/python"
ADVISOR=$WORK/user/bin/advisor
mkdir "$WORK/elsewhere"
cd "$WORK/elsewhere"
clean_run "$ADVISOR" --version
for profile in "${PROFILES[@]}"; do
    clean_run "$ADVISOR" recommend --model 7B --seq 32k --profile "$profile"
    holds "Recommended (*):" '"zero_optimization"' "deepspeed --num_gpus" "$profile"
    clean_run "$ADVISOR" predict --model 7B --seq 32k --profile "$profile" --zero 3 --checkpointing full
    holds "$profile"
    clean_run "$ADVISOR" predict --model qwen2.5-vl-7b --seq 16k --frames 8 --profile "$profile" --json
    "$WORK/user/bin/python" -c "import json, sys; p = json.load(open(sys.argv[1])); \
assert p['step_time_s'] > 0 and p['energy_j'] > 0, p" "$WORK/out" || fail "predict --json with $profile"
done
one_line_refusal "pip install 'energy-advisor[gpu]'" "$ADVISOR" calibrate --quick --out profile.json
one_line_refusal "data/runs" "$ADVISOR" recommend --model 7B --seq 4k --profile h200 --validate 2 --refit
one_line_refusal "checkout of the repository" "$ADVISOR" wheelhouse --out wheels --deepspeed-version 0.19.8
echo "   ok ($((SECONDS - start)) s)"
echo "user flows: ok"
