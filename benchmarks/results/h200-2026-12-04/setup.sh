# Sourced by every device call: carried wheels and the project into /tmp, one results folder per call.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
  || exit 3
python3 -m pip install -q --no-deps --no-build-isolation --no-compile --no-cache-dir --upgrade --target /tmp/site2 . || exit 3
export PYTHONPATH=/tmp/site:/tmp/site2 PYTHONUNBUFFERED=1
T0=$(date +%s)
left() { local s=$(( $1 - ($(date +%s) - T0) )); echo $(( s > 1 ? s : 1 )); }   # seconds left of a budget of $1 from the call start
pack_runs() { tar czf "$OUT/$1" --exclude='*.safetensors' --exclude='*.bin' --exclude='events.out*' \
  --exclude='data_cache' -C "$2" . 2>/dev/null; }
