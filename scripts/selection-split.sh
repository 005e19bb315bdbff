# Sourced by the selection scripts (preset-selection.sh, protection-selection.sh): `--preset best`
# on the calibration split. Needs DK (the depthkv program), TEXT (the calibration text), KEEP (keep
# ratios) and WORK (a scratch folder) set by the caller.
# split_preset_best TAG MODEL HALF CONTEXT CONTINUATION CSV [selection flags...]: profiles
# `--preset best` on windows 0..HALF-1 and evaluates it on windows HALF..2*HALF-1, rows to CSV.
split_preset_best() {
  local tag=$1 model=$2 half=$3 ctx=$4 cont=$5 csv=$6
  shift 6
  $DK profile --model "$model" --text "$TEXT" --context "$ctx" --continuation "$cont" --windows "$half" \
    "$@" --preset best -o "$WORK/$tag.profile.json" > /dev/null 2>&1
  $DK eval --model "$model" --text "$TEXT" --profile "$WORK/$tag.profile.json" --skip "$half" --windows "$half" \
    "$@" --preset best --keeps $KEEP --csv "$csv" > /dev/null 2>&1
  rm -f "${csv%.csv}-sensitivity.csv"
}
