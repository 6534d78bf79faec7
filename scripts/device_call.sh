#!/usr/bin/env bash
# One device call on the H200: each step's log goes to $OUT/<commit>-<step>.log, led by a
# provenance line (commit, device, UTC, command, versions); summaries go to $OUT (WB_RESULTS_DIR).
# Usage (in the device command, from the project root, after `source .gpu/install.sh`):
#   WB_GIT_COMMIT=<sha> WB_GIT_DIRTY=0|1 bash scripts/device_call.sh fast|depth|nvfp4|... [...]
# The tree that travels has no .git, so the caller says which commit it is and whether it had
# uncommitted changes (`git status --porcelain` outside results/ on the machine that sent it);
# provenance records both.
#   fast         the fast GPU subset (-m fast): each kernel's core exactness test once
#   depth|nvfp4  one part of the whole GPU suite (-m "gpu or compile" --gpu-part ...)
#   selected     the GPU and compile tests of $WB_TEST_FILES
#   ladder-quick the p0 ladder on the scaled H3 (--quick)
#   ladder-p2-quick the p2 ladder on the scaled H3 (--quick): P2's ring behind the same rungs
#   ladder-p1-quick the p1 ladder on the scaled H3 (--quick): P1 behind the same rungs
#   ladder-full  the full-size p0 ladder, resumable: each call continues the state in
#                results/runs/ladder-p0-full (git-ignored, so it stays on a warm machine;
#                its tensors, ~1-2.5 GB, never travel) for $WB_LADDER_BUDGET s (default 480),
#                then pauses (exit 75); repeat the call until it exits 0 or 1, at once (the
#                machine stays warm 30 s). The summary and report come back in $OUT at the end.
#                Packed weights go to $WB_WEIGHT_CACHE (default /tmp/wb-weights, ~8.4 GB on
#                the machine's disk): the first call packs and stores them, later calls load
#                them. With 3+ GPUs visible rungs 5-7 run their chains side by side
#                (--devices cuda:1,cuda:2,cuda:0: the reference, the adversary, and the p0
#                model on cuda:0, where its kernels were verified), with 2 the adversary alone
#                (cuda:0,cuda:1,cuda:0); $WB_LADDER_DEVICES overrides ("none": one device).
#   p0-v3-ab     scripts/p0_v3_ab.py ($WB_AB_ARGS, e.g. --seconds 170): the split-K fixup studies
#                and the TMA'd f16 activation against production (notes/p0-gemm.md, P0 v3)
#   p1-ab        scripts/p1_ab.py ($WB_AB_ARGS): P1 (quantized inside the GEMM) against P0
#   stress       scripts/stress_fast_loop.py ($WB_STRESS_ARGS, e.g. --conditions procs --seconds
#                200): the fast loop's frames under load, compared bitwise (notes/fast-loop.md v14a)
#   h3-trajectory the canonical full-size 12-step H3 trajectory on p0 (+ one reference block:
#                forward, oracle, audit, p0; the ladder's estimate on 1, 2 and 3 GPUs); it
#                fills the same weight cache the ladder loads (the packed bytes are the same
#                whichever backend packs them on CUDA)
#   frame-protocol experiments/frame_protocol.py (the depth frame's synchronisation alone)
#   frame-tiles-ab scripts/frame_tiles_ab.py ($WB_AB_ARGS): the frame's projection-tile knobs
#   depth-frame  experiments/depth_frame.py (the whole frame kernel beside the fast loop)
#   frame-code-size scripts/frame_code_size.py ($WB_AB_ARGS): the frame in parts, bodies compiled
#                alone or a tile step ablated (#37's code-size study and ablations)
#   frame-bits-ab scripts/frame_bits_ab.py ($WB_AB_ARGS, --old-tree DIR): the frame's outputs bit
#                for bit and its time against another commit's tree
#   frame-option-ab scripts/ab_frame_option.py ($WB_AB_ARGS, --option norm_once | chunk_waits):
#                one of the frame's exact options off and on, same run, alternating rounds,
#                bits compared (notes/depth-frame.md)
#   p0-baseline  experiments/p0_baseline.py alone (comfy_kitchen importable beside CuTe DSL; the
#                quack column needs .whl installed: pip install --no-index --no-deps --target
#                /tmp/site .whl/*.whl)
#   host-overhead experiments/host_overhead.py: host µs per eager call of the NVFP4 entries
#   host-breakdown scripts/host_breakdown.py: a planned Nvfp4Linear call's host time by step
#   p2-ring-capacity experiments/p2_ring_capacity.py ($WB_EXP_ARGS): the ring against capacity
#   p2-parity    experiments/p2_parity.py ($WB_EXP_ARGS, e.g. --quick): the full H3's qkv, out and
#                fc1 at blocks 0, 24, 49 through the ring (2048, 512), every chunk bit for bit
#                against P0's whole projection, sha256 equal (~4 min estimated)
#   p1-stream-a  experiments/p1_stream_a.py ($WB_EXP_ARGS): P1 beside the unfused path, P0, cuBLAS,
#                quack and Comfy (the comfy archive and .whl as for p0-baseline)
#   p2-block-gate experiments/p2_block_gate.py ($WB_EXP_ARGS): the unfused path, the ring and the
#                work queue alternating in one loaded full-size H3 block (~3-4 min estimated)
#   experiments  depth-loop, p0-baseline, the quick p0 ladder (the full one: ladder-full)
# WB_PYTEST_ARGS adds pytest arguments to the test steps (e.g. "-n 4 --dist loadfile": the H200
# image has pytest-xdist).
set -uo pipefail
: "${OUT:?run on the device machine}" "${WB_GIT_COMMIT:?name the commit}"
: "${WB_GIT_DIRTY:?say whether the tree that travelled had uncommitted changes (0 or 1)}"
export WB_GIT_DIRTY
export WB_RESULTS_DIR=$OUT PYTHONUNBUFFERED=1
sha=${WB_GIT_COMMIT:0:7}
header() {  # the provenance line every log starts with (commit and dirty from WB_GIT_*)
  python3 -m cli.main log-header "$1"
}
step() {  # step NAME COMMAND...: run it with its log, report its wall time
  local name=$1; shift
  local log=$OUT/$sha-$name.log t0=$SECONDS
  header "$*" > "$log"
  "$@" 2>&1 | tee -a "$log" | tail -n 4
  local rc=${PIPESTATUS[0]}
  echo "# $name: exit $rc after $((SECONDS - t0)) s" | tee -a "$log"
}
for what in "$@"; do
  case $what in
    # shellcheck disable=SC2086  # WB_PYTEST_ARGS is a list of words
    fast) step fast python3 -m pytest -q -m fast -p no:cacheprovider --durations=15 \
            ${WB_PYTEST_ARGS:-} ;;
    depth|nvfp4) step "tests-$what" python3 -m pytest -q -m "gpu or compile" --gpu-part "$what" \
                   -p no:cacheprovider --durations=25 ${WB_PYTEST_ARGS:-} ;;
    selected) step tests-selected python3 -m pytest -q -m "gpu or compile" -p no:cacheprovider \
                --durations=15 ${WB_PYTEST_ARGS:-} ${WB_TEST_FILES:?name the test files} ;;
    ladder-quick) step ladder-p0-quick python3 -m cli.main ladder --phase p0 --quick ;;
    ladder-p2-quick) step ladder-p2-quick python3 -m cli.main ladder --phase p2 --quick ;;
    ladder-p1-quick) step ladder-p1-quick python3 -m cli.main ladder --phase p1 --quick ;;
    ladder-full)
      d=results/runs/ladder-p0-full
      mkdir -p "$d"
      if [ -f "$d/ladder-p0.state/state.json" ] || [ -f "$d/ladder-p0.json" ]; then
        resume=(--resume "$d")  # paused: continue; finished: it says so and changes nothing
      else  # a fresh machine holds no state: the ladder starts from rung 1a
        echo "# ladder-full: no state in $d on this machine, starting the ladder"
        resume=(--phase p0)
      fi
      gpus=$(python3 -c 'import torch; print(torch.cuda.device_count())' 2>/dev/null || echo 1)
      devices=${WB_LADDER_DEVICES:-}
      if [ -z "$devices" ]; then
        if [ "$gpus" -ge 3 ]; then devices=cuda:1,cuda:2,cuda:0
        elif [ "$gpus" -eq 2 ]; then devices=cuda:0,cuda:1,cuda:0
        else devices=none; fi
      fi
      extra=()
      [ "$devices" != none ] && extra=(--devices "$devices")
      echo "# ladder-full: $gpus GPU(s) visible, devices $devices, weight cache" \
           "${WB_WEIGHT_CACHE:-/tmp/wb-weights}"
      step ladder-p0-full env WB_RESULTS_DIR="$d" \
        WB_WEIGHT_CACHE="${WB_WEIGHT_CACHE:-/tmp/wb-weights}" python3 -m cli.main ladder \
        "${resume[@]}" --stop-after "${WB_LADDER_BUDGET:-480}" ${extra[@]+"${extra[@]}"}
      for f in "$d"/ladder-p0.json "$d"/ladder-p0.md; do [ -f "$f" ] && cp "$f" "$OUT"/; done
      ;;
    h3-trajectory) step h3-trajectory env WB_WEIGHT_CACHE="${WB_WEIGHT_CACHE:-/tmp/wb-weights}" \
                     python3 -m experiments.h3_trajectory --reference-block ;;
    p0-baseline) step p0-baseline python3 -m experiments.p0_baseline ;;
    host-overhead) step host-overhead python3 -m experiments.host_overhead ;;
    host-breakdown) step host-breakdown env PYTHONPATH="$PWD:${PYTHONPATH:-}" \
                      python3 scripts/host_breakdown.py ;;
    p1-ab) step p1-ab env PYTHONPATH="$PWD:${PYTHONPATH:-}" python3 scripts/p1_ab.py \
             ${WB_AB_ARGS:-} ;;
    p2-ring-capacity) step p2-ring-capacity python3 -m experiments.p2_ring_capacity \
                        ${WB_EXP_ARGS:-} ;;
    p2-parity) step p2-parity python3 -m experiments.p2_parity ${WB_EXP_ARGS:-} ;;
    p2-block-gate) step p2-block-gate python3 -m experiments.p2_block_gate ${WB_EXP_ARGS:-} ;;
    p1-stream-a) step p1-stream-a python3 -m experiments.p1_stream_a ${WB_EXP_ARGS:-} ;;
    p0-v3-ab) step p0-v3-ab env PYTHONPATH="$PWD:${PYTHONPATH:-}" python3 scripts/p0_v3_ab.py \
                ${WB_AB_ARGS:-} ;;
    stress) step fast-loop-stress env PYTHONPATH="$PWD:${PYTHONPATH:-}" \
              python3 scripts/stress_fast_loop.py ${WB_STRESS_ARGS:-} ;;
    frame-protocol) step frame-protocol python3 -m experiments.frame_protocol ;;
    depth-frame) step depth-frame python3 -m experiments.depth_frame ${WB_EXP_ARGS:-} ;;
    frame-code-size) step frame-code-size env PYTHONPATH="$PWD:${PYTHONPATH:-}" \
                       python3 scripts/frame_code_size.py ${WB_AB_ARGS:-} ;;
    frame-bits-ab) step frame-bits-ab env PYTHONPATH="$PWD:${PYTHONPATH:-}" \
                     python3 scripts/frame_bits_ab.py ${WB_AB_ARGS:-} ;;
    frame-option-ab) step frame-option-ab env PYTHONPATH="$PWD:${PYTHONPATH:-}" \
                       python3 scripts/ab_frame_option.py ${WB_AB_ARGS:-} ;;
    frame-tiles-ab) step frame-tiles-ab env PYTHONPATH="$PWD:${PYTHONPATH:-}" \
                      python3 scripts/frame_tiles_ab.py ${WB_AB_ARGS:-} ;;
    experiments)
      step depth-loop python3 -m experiments.depth_loop
      step p0-baseline python3 -m experiments.p0_baseline
      step ladder-p0-quick python3 -m cli.main ladder --phase p0 --quick ;;
    *) echo "device_call.sh: unknown step '$what' (fast, depth, nvfp4, selected, ladder-quick," \
            "ladder-full, p0-v3-ab, p1-ab, stress, h3-trajectory, p0-baseline," \
            "host-overhead, host-breakdown, frame-protocol, depth-frame, frame-code-size, frame-bits-ab," \
            "frame-option-ab," \
            "ladder-p2-quick," \
            "p2-ring-capacity, p2-parity, p2-block-gate, p1-stream-a, ladder-p1-quick," \
            "frame-tiles-ab, experiments)" >&2; exit 2 ;;
  esac
done
