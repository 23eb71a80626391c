# Sourced by hack/cluster (and so hack/node) and hack/lws: stopping a background process they started, by the pid
# file they wrote for it under $PIDS.

stop_component() {  # stop_component NAME : TERM, then KILL after 10 s; gone when it returns
  local name="$1" pid i
  [[ -f "$PIDS/$name.pid" ]] || return 0
  pid="$(cat "$PIDS/$name.pid")"
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid"
    for ((i = 0; i < 40; i++)); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
    kill -0 "$pid" 2>/dev/null && kill -KILL "$pid"
  fi
  rm -f "$PIDS/$name.pid"
}
