#!/usr/bin/env bash
# Grid sweep: every combination of the comma-separated overrides, one run after another.
#   bash sweep.sh CONFIG m=0.5,0.95 seed=0,1,2 [key=value ...]      (DRY_RUN=1 only prints the runs)
# Each run is `bash launch.sh CONFIG <overrides> out_dir=<base>/<name>`: base = the config's out_dir, name = the swept
# values in command-line order (m=0.5 seed=1 -> m0.5_seed1; the first swept key varies slowest). Single-valued
# overrides go to every run and stay out of the name. A failed run does not stop the sweep; failures are listed at
# the end and the exit code is 1. Rerunning a sweep skips its finished runs (summary.json) and continues its
# unfinished ones (resume=auto), unless resume= or overwrite= is given. Then: python tables.py <base>/*
# Limitation: a comma always means a sweep, so a single value that contains a comma cannot be passed.
set -o pipefail
cd "$(dirname "$0")"
if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
case "${1:-}" in ""|*=*) set -- configs/tiny.yaml "$@" ;; esac
config=$1; shift

fixed=(); combos=("")            # combos: one string per run, its overrides joined by the unit separator $'\x1f'
for arg in "$@"; do
  case "$arg" in *=*) ;; *) echo "error: expected key=value, got '$arg'" >&2; exit 2 ;; esac
  key=${arg%%=*}; values=${arg#*=}
  if [[ "$values" != *,* ]]; then fixed+=("$arg"); continue; fi
  [ "$key" = out_dir ] && { echo "error: out_dir cannot be swept (sweep.sh sets it per run)" >&2; exit 2; }
  IFS=, read -ra vals <<< "$values"
  next=()
  for c in "${combos[@]}"; do for v in "${vals[@]}"; do next+=("$c${c:+$'\x1f'}$key=$v"); done; done
  combos=("${next[@]}")
done

IFS=$'\x1f' read -ra first <<< "${combos[0]}"
base=$("$PY" config.py "$config" "${fixed[@]}" "${first[@]}" --get out_dir) || exit 2

failed=(); i=0
for c in "${combos[@]}"; do
  i=$((i + 1))
  IFS=$'\x1f' read -ra swept <<< "$c"
  name=""
  for kv in "${swept[@]}"; do name+="${name:+_}${kv%%=*}${kv#*=}"; done
  name=${name//[^A-Za-z0-9._-]/-}
  out="$base${name:+/$name}"
  extra=()
  if [[ " ${fixed[*]} " != *" resume="* && " ${fixed[*]} " != *" overwrite="* ]]; then
    if [ -f "$out/summary.json" ]; then echo "[$i/${#combos[@]}] ${swept[*]} -> $out (finished: skipped)"; continue; fi
    [ -d "$out" ] && extra=(resume=auto)
  fi
  echo "[$i/${#combos[@]}] ${swept[*]} -> $out${extra[*]:+ (unfinished: resume=auto)}"
  [ -n "${DRY_RUN:-}" ] && [ "$DRY_RUN" != 0 ] && continue
  bash launch.sh "$config" "${fixed[@]}" "${swept[@]}" "out_dir=$out" "${extra[@]}" || failed+=("$out")
done

if [ ${#failed[@]} -gt 0 ]; then
  echo "sweep: ${#failed[@]} of ${#combos[@]} runs failed: ${failed[*]}" >&2
  exit 1
fi
[ -n "${DRY_RUN:-}" ] && [ "$DRY_RUN" != 0 ] && echo "sweep: ${#combos[@]} runs (dry run)" || echo "sweep: all ${#combos[@]} runs done under $base"
