#!/usr/bin/env bash
# trainadvisor in CI: one script for GitHub Actions, GitLab CI or any runner.
#
#   trainadvisor-ci.sh main   on the main branch: profile it (as written, no fixes) and keep the
#                             report as baseline:main
#   trainadvisor-ci.sh pr     on a pull/merge request: profile the head, compare it with
#                             baseline:main (without one, with the base commit $BASE_SHA,
#                             profiled here in a worktree), and write
#                               comment.md        the comparison and the head's diagnosis
#                               trainadvisor.sarif the head's findings on their lines
#                             exit 1 when the head is regression_likely, 2 on a usage problem
#
# Environment:
#   TRAIN_SCRIPT            the training script, relative to the repository (required)
#   TRAIN_ARGS              its arguments: enough steps for the warm-up and the window
#   WORKLOAD                what it trains (default: the script's name): compare refuses to
#                           gate reports of two workloads
#   GATE                    the smallest change in step time that matters, in % (default 5)
#   TRAINADVISOR_BASELINES  where baselines are kept: a folder that outlives the job on a
#                           self-hosted runner, or s3://bucket/prefix
#   TRAINADVISOR            the command (default: trainadvisor)
#   BASE_SHA                pr mode without a baseline:main: the commit to compare with
set -euo pipefail

mode=${1:?"give main or pr"}
read -r -a ta <<< "${TRAINADVISOR:-trainadvisor}"
script=${TRAIN_SCRIPT:?"set TRAIN_SCRIPT to the training script"}
workload=${WORKLOAD:-$(basename "$script" .py)}
read -r -a args <<< "${TRAIN_ARGS:-}"

profile() {  # profile OUT [FORMAT]: the code as written, no fixes
    "${ta[@]}" profile --no-fix --workload "$workload" --format "${2:-terminal}" --out "$1" \
        "$script" "${args[@]}"
}

case $mode in
main)
    profile main-report
    "${ta[@]}" baseline save main main-report
    ;;
pr)
    profile head-report sarif > trainadvisor.sarif
    if "${ta[@]}" baseline list | grep -q '^baseline:main[[:space:]]'; then
        against=(--against baseline:main head-report)
    else
        : "${BASE_SHA:?no baseline:main saved yet: set BASE_SHA to the commit to compare with}"
        git worktree add --force base-checkout "$BASE_SHA" > /dev/null
        (cd base-checkout && profile ../base-report)
        against=(base-report head-report)
    fi
    status=0
    "${ta[@]}" compare --gate "${GATE:-5}" --format markdown "${against[@]}" > comment.md || status=$?
    if [ "$status" -ge 2 ]; then
        cat comment.md
        exit "$status"
    fi
    { echo; cat head-report/report.md; } >> comment.md
    echo "trainadvisor: compare exited $status; comment.md and trainadvisor.sarif written"
    exit "$status"
    ;;
*)
    echo "trainadvisor-ci.sh: give main or pr, not $mode" >&2
    exit 2
    ;;
esac
