# The loop of the grid scripts (redteam_grid.sh, tldr_grid.sh, staleness_test.sh), sourced: one seed at a time over
# every arm, so a partial grid is balanced; a finished run (summary.json) is skipped and an unfinished one resumed.
# run_grid CONFIG: for each seed in $SEEDS and arm in ${ARMS:-$ORDER}, `launch.sh CONFIG ${ARM[arm]}` into
# $OUT/<arm>/seed<seed>; exits 2 on an unknown arm, 1 if any run failed. DRY_RUN=1 only prints the runs.
# With PACKED=DIR (a grid that spans sessions and machines), a run packed there (scripts/pack_runs.py) counts as
# finished, and each run is packed there as soon as it finishes, so the next session, on any clone, goes on from it.
run_grid() {
  local config=$1 seed arm dir failed=()
  for seed in $SEEDS; do
    for arm in ${ARMS:-$ORDER}; do
      [ -n "${ARM[$arm]+x}" ] || { echo "error: unknown arm '$arm' (one of: $ORDER)" >&2; exit 2; }
      dir="$OUT/$arm/seed$seed"
      [ -f "$dir/summary.json" ] && { echo "skip $dir (finished)"; continue; }
      [ -n "${PACKED:-}" ] && [ -f "$PACKED/$arm/seed$seed/summary.json" ] && { echo "skip $dir (packed in $PACKED)"; continue; }
      echo "== $arm seed $seed -> $dir: ${ARM[$arm]}"
      [ "${DRY_RUN:-0}" != 0 ] && continue
      # shellcheck disable=SC2086
      if bash launch.sh "$config" ${ARM[$arm]} seed="$seed" out_dir="$dir" progress=false resume=auto; then
        [ -z "${PACKED:-}" ] || "${PY:-python3}" scripts/pack_runs.py --run "$dir" "$PACKED/$arm/seed$seed"
      else
        failed+=("$dir")
      fi
    done
  done
  [ ${#failed[@]} -eq 0 ] || { echo "failed: ${failed[*]}" >&2; exit 1; }
}
