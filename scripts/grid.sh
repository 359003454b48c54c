# The loop of the grid scripts (redteam_grid.sh, tldr_grid.sh), sourced: one seed at a time over every arm, so a
# partial grid is balanced; a finished run (summary.json) is skipped and an unfinished one resumed.
# run_grid CONFIG: for each seed in $SEEDS and arm in ${ARMS:-$ORDER}, `launch.sh CONFIG ${ARM[arm]}` into
# $OUT/<arm>/seed<seed>; exits 2 on an unknown arm, 1 if any run failed. DRY_RUN=1 only prints the runs.
run_grid() {
  local config=$1 seed arm dir failed=()
  for seed in $SEEDS; do
    for arm in ${ARMS:-$ORDER}; do
      [ -n "${ARM[$arm]+x}" ] || { echo "error: unknown arm '$arm' (one of: $ORDER)" >&2; exit 2; }
      dir="$OUT/$arm/seed$seed"
      [ -f "$dir/summary.json" ] && { echo "skip $dir (finished)"; continue; }
      echo "== $arm seed $seed -> $dir: ${ARM[$arm]}"
      [ "${DRY_RUN:-0}" != 0 ] && continue
      # shellcheck disable=SC2086
      bash launch.sh "$config" ${ARM[$arm]} seed="$seed" out_dir="$dir" progress=false resume=auto || failed+=("$dir")
    done
  done
  [ ${#failed[@]} -eq 0 ] || { echo "failed: ${failed[*]}" >&2; exit 1; }
}
