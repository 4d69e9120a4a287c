#!/usr/bin/env bash
# The tiny end-to-end demo on a CPU (a few minutes on 2 cores): the config library, then the whole
# recipe as one SolarRun (Stage0.5 FM -> Stage1 TF-AnyFlow -> Stage2 DMD via SGF -> generation)
# executed locally by `solar run`, ending with the completion report of each stage.
set -euo pipefail
cd "$(dirname "$0")/.."
out="demo-out/$(date +%Y%m%d-%H%M%S)"
mkdir -p "$out"
step() { printf '\n== %s\n' "$*"; }

step "solar environment probe (torch, CUDA, GPUs, env)"
solar environment probe > "$out/environment.json"
python3 -c 'import json,sys; f=json.load(open(sys.argv[1])); print("python", f["python"]["version"], "| torch", f["torch"].get("version"), "| cuda", f["cuda"]["available"], "| devices", len(f["devices"]))' "$out/environment.json"

step "solar config routes"
solar config routes

step "solar config resolve: every tiny config, placeholders supplied with --set"
for cfg in configs/solar_wm/tiny/*/*.yaml; do
  family=$(basename "$(dirname "$cfg")"); name=$(basename "$cfg" .yaml)
  sets=(--set data.root="$PWD/$out/data/$family" --set runtime.output_dir="$PWD/$out/runs/$family-$name")
  case "$name" in infer_*) sets+=(--set checkpoint.path="$PWD/$out/runs/$family-checkpoint");; esac
  solar config resolve --config "$cfg" "${sets[@]}" --output "$out/resolved-$family-$name.json" 2>&1 | sed 's/^solar: //'
done

step "a rejection: MiniMax-H3 with the linear camera transform (exit 2, nothing written)"
if solar config resolve --config configs/solar_wm/tiny/minimax_h3/train_stage0p5_fm_158f.yaml \
     --set data.root=/d --set runtime.output_dir=/o --set model.camera_translation_transform=linear \
     --output "$out/rejected.json"; then
  echo "unexpected success" >&2; exit 1
fi
test ! -e "$out/rejected.json"

step "solar data synth: a tiny camera-driven dataset for Wan TI2V-5B"
rm -rf demo-out/synth/wan22_ti2v_5b
solar data synth --family wan22_ti2v_5b --out demo-out/synth/wan22_ti2v_5b --samples 4 2>/dev/null

step "solar run examples/solarrun-tiny.yaml: the four stages, each loading the previous one"
solar run examples/solarrun-tiny.yaml --workdir "$out/runs"

step "solar report: the completion report of each stage (HTML beside it)"
for stage in fm anyflow dmd generate; do
  solar report "$out/runs/tiny-wan/$stage" --html "$out/report-$stage.html"
  echo
done

step "done: outputs in $out (open $out/report-*.html)"
