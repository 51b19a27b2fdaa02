#!/usr/bin/env bash
# Peer benchmark (issue 29): our CPU engine (`moectl run`, experts in memory)
# against llama.cpp on the same random Mixtral-layout model, at the same
# thread counts, for bf16 / q8 / q4 experts (ours) against BF16 / Q8_0 / Q4_0
# (llama.cpp), and (issue 30) both engines on the same GGUF file: q4_k_m
# (llama.cpp's own Q4_K_M mixture) and q4_0-gguf (the Q4_0 file above). A
# tool for people, never run in CI.
#
# What it does (everything lives in a scratch folder, $PEER_DIR or
# /tmp/moe-peer, reused by later runs: nothing is fetched or built twice):
#  1. llama.cpp's prebuilt release from npm: node-llama-cpp@3.22.1 +
#     @node-llama-cpp/linux-x64@3.22.1, installed with
#     NODE_LLAMA_CPP_SKIP_DOWNLOAD=true and --ignore-scripts --omit=optional
#     (nothing is downloaded or built by the package); headers, gguf-py from
#     the llama.cpp git bundle inside the package (llama/gitRelease.bundle).
#  2. Builds tests/bench/peer/llama_driver.cc (greedy decoding, timing with a
#     persistent ggml threadpool, expert quantization) against the prebuilt
#     libllama with g++, and tests/bench/peer/read_bw.cc (read bandwidth).
#  3. A model: `moectl make-model` (mixtral, 4 layers x 8 experts top-2,
#     hidden 1024, expert width 2048, GQA 8/2 heads, vocab 512, bf16, 406 MiB;
#     --quick: 2 layers, hidden 512, width 1024), written as GGUF by
#     tests/bench/peer/safetensors_to_gguf.py (gguf-py; llama.cpp's
#     convert_hf_to_gguf.py needs torch), then `llama_driver quantize` makes
#     the Q8_0 / Q4_0 files (experts only; the rest stays BF16 / F32, as ours).
#     Our side reads the safetensors folder with --expert-format bf16|q8|q4
#     (converted into memory at load); for q4_k_m and q4_0-gguf it reads
#     llama.cpp's file itself, its blocks held as they are.
#  4. The machine's memory read bandwidth (read_bw) per thread count, measured
#     right before and right after the timing (step 6).
#  5. Token check (tests/bench/peer/check_tokens.py): 4 prompts of token ids
#     x 32 greedy tokens, both sides, per format. bf16 and q8 must agree up to
#     near-ties, else the script stops. Where the tokens part, it is a
#     near-tie if llama.cpp's token is within --tie-nats (0.05) of ours in our
#     log-probs, or if a router near-tie earlier in the sequence explains it:
#     tests/bench/peer/explain_divergence.py teacher-forces the common prefix
#     through the float64 reference (tests/reference/moe_reference.py) and
#     flips the closest router decisions one at a time; one flip giving
#     llama.cpp's token explains it. (llama.cpp rounds activations to bf16 in
#     BF16 products and to 8 bits with f16 scales in Q8_0 ones; ours keeps
#     f32 activations for bf16, f32 scales for q8; a random model's router
#     has decisions within 1e-3.) Only tokens up to the first difference are
#     compared. q4 is reported, not checked: our q4 (64-weight groups, scale +
#     min) is not llama.cpp's Q4_0 (32-weight groups, scale only); both are
#     4.5 bits per weight.
#  6. Timing, sides alternated (which goes first flips every configuration
#     and rep): a P-token prompt (200) in one batch, then N greedy tokens (64).
#     Ours: `moectl run --cpu-threads T --json --warmup 1` (TTFT = the
#     prompt + first token; TPOT over the later N-1 tokens), a fresh process
#     per run whose prompt runs once untimed first (--cold: not, so the
#     timed prompt is the process's first forward). llama.cpp: llama_driver bench,
#     weights read into memory at load (LLAMA_MMAP=1: mapped), the prompt
#     once cold (reported apart), then timed warm as llama-bench does, then
#     the decode. Medians and ranges over the reps; ratio = ours / llama.cpp.
#     Achieved decode bandwidth: the bytes read per token x tokens/s,
#     against read_bw, for the experts (MoE layers x top-k x bytes per
#     expert of the format) and for all weights (the experts plus the dense
#     weights: attention, routers, norms, lm_head, one embedding row; the
#     same bytes on both sides, as both keep them in bf16 / f32).
#
# usage: tests/bench/peer_bench.sh [--quick] [--threads 1,2]
#          [--formats bf16,q8,q4,q4_k_m,q4_0-gguf] [--cold]
#          [--reps 5] [--n-gen 64] [--prompt-tokens 200] [--tie-nats 0.05]
#          [--quiet-wait SEC] [--retries 2] [--max-others 0.25]
#          [--build DIR] [--peer-dir DIR] [--model DIR] [--keep]
#   --quick: 1 rep, 1 thread (unless given), the small model, 32 tokens.
#   --model DIR: a safetensors folder of ours instead of the random model
#     (e.g. deploy/models/kjv-moe, the trained model: its rows, 192 and 64
#     wide, suit BF16 / Q8_0 / Q4_0 but not the K-quants, which need 256);
#     its GGUF files are written to the scratch folder as peer-<name>-*.gguf.
#   --quiet-wait SEC: before each pair of timed runs, wait while other
#     processes keep > 1/4 core busy (at most SEC seconds over the whole run).
#   Each timed run also records the CPU other processes used meanwhile
#   ("others" column, in cores): on a shared machine, read it before the
#   numbers (llama.cpp's spinning threadpool suffers most when a core is
#   taken). --retries N: a pair where either run saw others above
#   --max-others cores is run again, up to N more times (the last is kept).
# env: PEER_DIR (scratch folder), MOE_CPU_SIMD (caps our SIMD level),
#      LLAMA_MMAP=1, PY (a python3 with numpy; default /usr/bin/python3)
# Run it niced on a shared machine: nice -n 10 tests/bench/peer_bench.sh
set -euo pipefail

die() { echo "peer_bench: $*" >&2; exit 1; }

root=$(cd "$(dirname "$0")/../.." && pwd)
build=$root/build
peer=${PEER_DIR:-/tmp/moe-peer}
threads=1,2
formats=bf16,q8,q4
reps=5
n_gen=64
prompt_tokens=200
tie_nats=0.05
quick=0
keep=0
user_model=
threads_set=0
reps_set=0
quiet_wait=0
cold=0
retries=2
max_others=0.25
while [ $# -gt 0 ]; do
  case $1 in
    --quick) quick=1 ;;
    --threads) threads=${2:?--threads needs a list}; threads_set=1; shift ;;
    --formats) formats=${2:?--formats needs a list}; shift ;;
    --reps) reps=${2:?--reps needs a number}; reps_set=1; shift ;;
    --quiet-wait) quiet_wait=${2:?--quiet-wait needs seconds}; shift ;;
    --retries) retries=${2:?--retries needs a number}; shift ;;
    --max-others) max_others=${2:?--max-others needs cores}; shift ;;
    --n-gen) n_gen=${2:?--n-gen needs a number}; shift ;;
    --prompt-tokens) prompt_tokens=${2:?--prompt-tokens needs a number}; shift ;;
    --tie-nats) tie_nats=${2:?--tie-nats needs a number}; shift ;;
    --build) build=${2:?--build needs a directory}; shift ;;
    --peer-dir) peer=${2:?--peer-dir needs a directory}; shift ;;
    --model) user_model=${2:?--model needs a directory}; shift ;;
    --keep) keep=1 ;;
    --cold) cold=1 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument '$1' (--help lists them)" ;;
  esac
  shift
done
if [ "$quick" = 1 ]; then
  [ "$reps_set" = 1 ] || reps=1
  [ "$threads_set" = 1 ] || threads=1
  [ "$n_gen" = 64 ] && n_gen=32
fi
threads=${threads//,/ }
formats=${formats//,/ }
for f in $formats; do
  case $f in bf16|q8|q4|q4_k_m|q4_0-gguf) ;;
    *) die "unknown format '$f' (bf16, q8, q4, q4_k_m, q4_0-gguf)" ;; esac
done
for t in $threads; do [[ $t =~ ^[1-9][0-9]*$ ]] || die "bad thread count '$t'"; done
[[ $reps =~ ^[1-9][0-9]*$ ]] || die "bad --reps '$reps'"
[[ $n_gen =~ ^[0-9]+$ ]] && [ "$n_gen" -ge 2 ] || die "--n-gen must be >= 2"
[[ $prompt_tokens =~ ^[1-9][0-9]*$ ]] || die "bad --prompt-tokens '$prompt_tokens'"
[[ $quiet_wait =~ ^[0-9]+$ ]] || die "bad --quiet-wait '$quiet_wait'"
[[ $retries =~ ^[0-9]+$ ]] || die "bad --retries '$retries'"
[[ $max_others =~ ^[0-9]*\.?[0-9]+$ ]] || die "bad --max-others '$max_others'"

py=${PY:-/usr/bin/python3}
moectl=$build/bin/moectl
[ -x "$moectl" ] || die "no $moectl: build it first (cmake --build build --target moectl)"
# shellcheck source=peer/peer_lib.sh
. "$root/tests/bench/peer/peer_lib.sh"
peer_check_tools
[ -x "$py" ] || die "no python at $py (set PY)"
"$py" -c 'import numpy' 2>/dev/null || die "$py cannot import numpy (Debian: apt-get install python3-numpy)"

mkdir -p "$peer"
peer=$(cd "$peer" && pwd)
work=$(mktemp -d "$peer/run.XXXXXX")
cleanup() { if [ "$keep" = 1 ]; then echo "kept $work" >&2; else rm -rf "$work"; fi; }
trap cleanup EXIT
log() { echo "[$(date +%H:%M:%S)] $*" >&2; }

# --- 1-2. llama.cpp (npm), llama_driver and read_bw: peer/peer_lib.sh ---
peer_setup

# --- 3. the model: safetensors (ours), GGUF BF16 / Q8_0 / Q4_0 (llama.cpp) ---
if [ -n "$user_model" ]; then
  [ -s "$user_model/model.safetensors" ] && [ -s "$user_model/config.json" ] ||
    die "--model $user_model: no model.safetensors + config.json there"
  name=peer-$(basename "$(cd "$user_model" && pwd)")
  model=$(cd "$user_model" && pwd)
  make_args="$model"
elif [ "$quick" = 1 ]; then
  name=model-quick
  make_args="--arch mixtral --layers 2 --hidden 512 --heads 4 --kv-heads 1 --experts 8 --top-k 2 --intermediate 1024 --vocab 512 --seed 29"
else
  name=model-full
  make_args="--arch mixtral --layers 4 --hidden 1024 --heads 8 --kv-heads 2 --experts 8 --top-k 2 --intermediate 2048 --vocab 512 --seed 29"
fi
if [ -z "$user_model" ]; then
  model=$peer/$name
  if [ "$(cat "$model/.peer-make-args" 2>/dev/null)" != "$make_args" ]; then
    log "making $model (moectl make-model $make_args)"
    rm -f "$peer/$name"-*.gguf
    # shellcheck disable=SC2086
    nice -n 10 "$moectl" make-model $make_args --out "$model" --force >/dev/null
    echo "$make_args" >"$model/.peer-make-args"
  fi
fi
gguf_bf16=$peer/$name-bf16.gguf
if [ ! -s "$gguf_bf16" ] || [ "$model/model.safetensors" -nt "$gguf_bf16" ] ||
   [ "$root/tests/bench/peer/safetensors_to_gguf.py" -nt "$gguf_bf16" ]; then
  log "writing $gguf_bf16"
  rm -f "$peer/$name"-q*.gguf
  nice -n 10 "$py" "$root/tests/bench/peer/safetensors_to_gguf.py" "$model" "$gguf_bf16.tmp" \
    --gguf-py "$src/gguf-py" || die "GGUF conversion failed"
  mv "$gguf_bf16.tmp" "$gguf_bf16"
fi
llama_type() {
  case $1 in bf16) echo bf16 ;; q8) echo q8_0 ;; q4|q4_0-gguf) echo q4_0 ;; q4_k_m) echo q4_k_m ;; esac
}
gguf_of() { echo "$peer/$name-$(llama_type "$1").gguf"; }
# What our side reads for format F: the folder converted at load, or (the
# same-file formats) llama.cpp's GGUF as it is.
ours_model() {
  case $1 in
    q4_k_m|q4_0-gguf) echo --model "$(gguf_of "$1")" ;;
    *) echo --model "$model" --expert-format "$1" ;;
  esac
}
for f in $formats; do
  g=$(gguf_of "$f")
  if [ "$f" != bf16 ] && { [ ! -s "$g" ] || [ "$gguf_bf16" -nt "$g" ]; }; then
    log "quantizing experts to $(llama_type "$f"): $g"
    nice -n 10 "$driver" quantize "$gguf_bf16" "$g.tmp" "$(llama_type "$f")" --threads 2 \
      >"$work/quantize.log" 2>&1 || { cat "$work/quantize.log" >&2; die "quantize failed"; }
    mv "$g.tmp" "$g"
  fi
done
"$moectl" inspect "$model" >"$work/inspect.txt"
for f in $formats; do
  case $f in q4_k_m|q4_0-gguf) "$moectl" inspect "$(gguf_of "$f")" >"$work/inspect-$f.txt" ;; esac
done
"$driver" gen --model "$gguf_bf16" --threads 1 --n-gen 2 --prompts <(echo 1) --verbose \
  >/dev/null 2>"$work/llama-info.txt" || { cat "$work/llama-info.txt" >&2; die "llama_driver cannot run the model"; }

# Prompts: 4 for the token check (4, 8, 16, 32 ids), one of P ids for timing.
"$py" - "$work" "$prompt_tokens" <<'EOF'
import random, sys
work, p = sys.argv[1], int(sys.argv[2])
r = random.Random(29)
with open(f"{work}/check_prompts.txt", "w") as f:
    for n in (4, 8, 16, 32):
        f.write(",".join(str(r.randrange(509)) for _ in range(n)) + "\n")
with open(f"{work}/bench_prompt.txt", "w") as f:
    f.write(",".join(str(r.randrange(509)) for _ in range(p)) + "\n")
EOF
bench_prompt=$(cat "$work/bench_prompt.txt")
first_t=${threads%% *}

# --- 5. token check ---
check_n=32
for f in $formats; do
  log "token check $f: 4 prompts x $check_n tokens, $first_t thread(s)"
  i=0
  while read -r p; do
    i=$((i + 1))
    # shellcheck disable=SC2046
    "$moectl" run $(ours_model "$f") --cpu-threads "$first_t" --prompt-ids "$p" \
      --max-new-tokens "$check_n" --ignore-eos --json --top-logprobs 5 \
      >"$work/check-ours-$f-$i.jsonl" 2>"$work/check-ours-$f-$i.err" ||
      { cat "$work/check-ours-$f-$i.err" >&2; die "moectl run failed ($f, prompt $i)"; }
  done <"$work/check_prompts.txt"
  "$driver" gen --model "$(gguf_of "$f")" --threads "$first_t" --n-gen "$check_n" \
    --prompts "$work/check_prompts.txt" >"$work/check-llama-$f.txt" 2>"$work/check-llama-$f.err" ||
    { cat "$work/check-llama-$f.err" >&2; die "llama_driver gen failed ($f)"; }
done
"$py" "$root/tests/bench/peer/check_tokens.py" "$work" "$model" "$formats" "$check_n" "$tie_nats" ||
  die "TOKEN CHECK FAILED: the engines differ beyond near-ties (see above)"

# --- 4 and 6. read bandwidth (before and after the timing), timing, sides alternated ---
# Other processes' CPU during each timed run (this machine is shared): the
# busy jiffies of /proc/stat over the run minus the run's own user + system
# time, in cores (0 = nothing else ran; 1 = a whole other core was busy).
busy_jiffies() { awk '/^cpu /{print $2 + $3 + $4 + $7 + $8 + $9}' /proc/stat; }
hz=$(getconf CLK_TCK)
timed() {  # OUT_PREFIX CMD...: runs CMD (stdout to OUT_PREFIX, stderr to .err), writes .others
  local pre=$1 b0 b1 rc=0
  shift
  b0=$(busy_jiffies)
  if [ -x /usr/bin/time ]; then
    /usr/bin/time -o "$pre.time" -f "%e %U %S" "$@" >"$pre" 2>"$pre.err" || rc=$?
  else
    "$@" >"$pre" 2>"$pre.err" || rc=$?
  fi
  b1=$(busy_jiffies)
  if [ -s "$pre.time" ]; then
    awk -v b="$((b1 - b0))" -v hz="$hz" '{o = b / hz - $2 - $3; if (o < 0) o = 0; printf "%.3f\n", o / $1}' \
      "$pre.time" >"$pre.others"
  fi
  return $rc
}
run_ours() {  # FORMAT THREADS REP
  local out=$work/t-ours-$1-$2-$3.json
  # shellcheck disable=SC2046
  timed "$out.all" "$moectl" run $(ours_model "$1") --cpu-threads "$2" \
    --prompt-ids "$bench_prompt" --max-new-tokens "$n_gen" --ignore-eos --json \
    --warmup "$((1 - cold))" ||
    { cat "$out.all.err" >&2; die "moectl run failed ($1, $2 threads)"; }
  tail -1 "$out.all" >"$out"
  cp "$out.all.others" "$out.others" 2>/dev/null || true
}
run_llama() {  # FORMAT THREADS REP
  local out=$work/t-llama-$1-$2-$3.json
  local mm=()
  [ "${LLAMA_MMAP:-0}" = 1 ] && mm=(--mmap)
  timed "$out" "$driver" bench --model "$(gguf_of "$1")" --threads "$2" --n-gen "$n_gen" \
    --prompt-ids "$bench_prompt" "${mm[@]}" ||
    { cat "$out.err" >&2; die "llama_driver bench failed ($1, $2 threads)"; }
}
# --quiet-wait SEC: before each pair of runs, wait (at most SEC seconds in
# all) while other processes keep more than a quarter of a core busy.
waited=0
wait_quiet() {
  local b0 b1 busy
  while [ "$waited" -lt "$quiet_wait" ]; do
    b0=$(busy_jiffies); sleep 1; b1=$(busy_jiffies)
    busy=$(( (b1 - b0) * 100 / hz ))  # percent of a core, over 1 s
    [ "$busy" -le 25 ] && return 0
    [ $((waited % 60)) -lt 6 ] && log "waiting for a quiet machine (others busy: ${busy}% of a core)"
    sleep 5
    waited=$((waited + 6))
  done
}
wait_quiet
log "read bandwidth (read_bw, 1 GiB, threads $threads)"
"$read_bw" --mb 1024 --threads "${threads// /,}" --reps 7 >"$work/read_bw.txt"
load_before=$(cut -d' ' -f1-3 /proc/loadavg)
# clean_pair FORMAT THREADS REP: both runs had others' CPU <= --max-others.
clean_pair() {
  cat "$work/t-ours-$1-$2-$3.json.others" "$work/t-llama-$1-$2-$3.json.others" 2>/dev/null |
    awk -v m="$max_others" '$1 > m {bad = 1} END {exit bad}'
}
rerun=0
n=0
for r in $(seq 1 "$reps"); do
  for t in $threads; do
    for f in $formats; do
      n=$((n + 1))
      for attempt in $(seq 0 "$retries"); do
        wait_quiet
        log "timing rep $r/$reps: $f, $t thread(s)$([ "$attempt" = 0 ] || echo ", again ($attempt)")"
        if [ $(( (n + r) % 2 )) = 0 ]; then
          run_ours "$f" "$t" "$r"; run_llama "$f" "$t" "$r"
        else
          run_llama "$f" "$t" "$r"; run_ours "$f" "$t" "$r"
        fi
        clean_pair "$f" "$t" "$r" && break
        [ "$attempt" = "$retries" ] || rerun=$((rerun + 1))
      done
    done
  done
done
load_after=$(cut -d' ' -f1-3 /proc/loadavg)
wait_quiet
"$read_bw" --mb 1024 --threads "${threads// /,}" --reps 7 >>"$work/read_bw.txt"

# --- the tables ---
cpu=$(sed -n 's/^model name\s*: //p' /proc/cpuinfo | head -1)
backend=$(sed -n 's/.*loaded CPU backend from .*\/\(libggml-cpu-[a-z0-9]*\)\.so.*/\1/p' "$work/llama-info.txt" | head -1)
echo
echo "## peer benchmark: moectl run vs llama.cpp ($llama_tag, node-llama-cpp $nlc_version prebuilt, $backend)"
echo
echo "- machine: $cpu, $(nproc) CPUs; load average before $load_before, after $load_after"
echo "- ours: $("$moectl" --version 2>/dev/null | head -1)${MOE_CPU_SIMD:+, MOE_CPU_SIMD=$MOE_CPU_SIMD}"
echo "- model: $name ($make_args), $(sed -n 's/^total bytes: //p' "$work/inspect.txt") bf16"
echo "- prompt $prompt_tokens tokens in one batch, then $n_gen greedy tokens; $reps rep(s), sides alternated;" \
  "$rerun pair(s) re-run because other processes used > $max_others cores (at most $retries times each)"
"$py" - "$work" "$reps" "$threads" "$formats" "$cold" <<'EOF'
import json, re, statistics, sys
work, reps, threads, formats = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(), sys.argv[4].split()
ins = open(f"{work}/inspect.txt").read()
def num(pat):
    return int(re.search(pat, ins, re.M).group(1))
bpe = {"bf16": num(r"^bytes per expert: (\d+)"), "q8": num(r"^bytes per expert as q8: (\d+)"),
       "q4": num(r"^bytes per expert as q4: (\d+)")}
weights = bpe["bf16"] // 2
llama_bpe = {"bf16": weights * 2, "q8": weights * 34 // 32, "q4": weights * 18 // 32}
for f in ("q4_k_m", "q4_0-gguf"):  # the file's own bytes, the same on both sides (largest layer)
    try:
        g = open(f"{work}/inspect-{f}.txt").read()
        bpe[f] = llama_bpe[f] = int(re.search(r"^bytes per expert: (\d+)", g, re.M).group(1))
    except (OSError, AttributeError):
        pass
per_tok = num(r"^moe layers: (\d+)") * num(r"^top-k: (\d+)")
hidden = num(r"^hidden: (\d+)")
# Dense weights read per token: all but the embedding table, plus its row.
dense = num(r"^dense bytes: (\d+)") - num(r"vocab: (\d+)") * hidden * 2 + 2 * hidden
bw = {}  # threads -> medians measured before and after the timing
for l in open(f"{work}/read_bw.txt"):
    p = l.split()
    bw.setdefault(p[1], []).append(float(p[3]))
names = {"bf16": "BF16", "q8": "Q8_0", "q4": "Q4_0", "q4_k_m": "Q4_K_M (same file)",
         "q4_0-gguf": "Q4_0 (same file)"}
def load(side, f, t, key):
    v = []
    for r in range(1, reps + 1):
        j = json.load(open(f"{work}/t-{side}-{f}-{t}-{r}.json"))
        u = j.get("usage", j)
        ttft, tpot = u["time_to_first_token_seconds"], u["time_per_output_token_seconds"]
        p = u["prompt_tokens"]
        v.append({"decode": 1 / tpot, "pp": p / ttft,
                  "cold": p / j["cold_time_to_first_token_seconds"] if "cold_time_to_first_token_seconds" in j else None}[key])
    return v
def others(side, f, t):
    v = []
    for r in range(1, reps + 1):
        try:
            v.append(float(open(f"{work}/t-{side}-{f}-{t}-{r}.json.others").read()))
        except (OSError, ValueError):
            pass
    return f"{statistics.median(v):.2f}" if v else "-"
def cell(v):
    m = statistics.median(v)
    return f"{m:.1f}" if len(v) == 1 else f"{m:.1f} ({min(v):.1f}-{max(v):.1f})"
print()
cold = sys.argv[5] == "1"
print("tokens/s: median (min-max) over the reps; ratio = ours / llama.cpp (medians); prompt: "
      + ("ours is the process's first forward, llama.cpp's the second" if cold else
         "both warm (ours after one untimed run of the prompt, llama.cpp's second forward)")
      + " (llama.cpp's cold first one in the next column); others' CPU:"
      " median cores other processes used during the runs")
print()
print("| experts (ours / llama.cpp) | threads | decode ours | decode llama.cpp | ratio | prompt ours | prompt llama.cpp | ratio | llama.cpp prompt, cold | others' CPU (ours / llama.cpp) |")
print("|---|---|---|---|---|---|---|---|---|---|")
gbps = []
for t in threads:
    for f in formats:
        od, ld = load("ours", f, t, "decode"), load("llama", f, t, "decode")
        op, lp, lc = load("ours", f, t, "pp"), load("llama", f, t, "pp"), load("llama", f, t, "cold")
        md = statistics.median(od) / statistics.median(ld)
        mp = statistics.median(op) / statistics.median(lp)
        print(f"| {f} / {names[f]} | {t} | {cell(od)} | {cell(ld)} | {md:.2f} | {cell(op)} | {cell(lp)} | {mp:.2f} | {cell(lc)} | {others('ours', f, t)} / {others('llama', f, t)} |")
        ob = per_tok * bpe[f] * statistics.median(od) / 1e9
        lb = per_tok * llama_bpe[f] * statistics.median(ld) / 1e9
        gbps.append((f, t, per_tok * bpe[f], ob, per_tok * llama_bpe[f], lb))
print()
print("decode bandwidth: bytes read per token x median decode tokens/s, against the read bandwidth"
      " (read_bw: 1 GiB, median of 7, before / after the timing; % of the higher); experts alone, and"
      f" all weights (the experts + {dense / 1e6:.1f} MB of dense weights per token, the same on both sides;"
      " the folder's bf16 dense bytes, so for the same-file formats, whose dense weights are"
      " quantized too, the 'all' columns are an upper bound)")
print()
print("| experts | threads | read GB/s | MB/token: experts / all | ours GB/s: experts / all | % of read (all) | llama.cpp MB/token: experts / all | llama.cpp GB/s: experts / all | % of read (all) |")
print("|---|---|---|---|---|---|---|---|---|")
for f, t, obytes, ob, lbytes, lb in gbps:
    r = max(bw.get(t, [float("nan")]))
    rs = " / ".join(f"{x:.1f}" for x in bw.get(t, []))
    oall = ob * (obytes + dense) / obytes
    lall = lb * (lbytes + dense) / lbytes
    print(f"| {f} / {names[f]} | {t} | {rs} | {obytes / 1e6:.1f} / {(obytes + dense) / 1e6:.1f} | {ob:.1f} / {oall:.1f} | {100 * ob / r:.0f}% ({100 * oall / r:.0f}%) | {lbytes / 1e6:.1f} / {(lbytes + dense) / 1e6:.1f} | {lb:.1f} / {lall:.1f} | {100 * lb / r:.0f}% ({100 * lall / r:.0f}%) |")
EOF
