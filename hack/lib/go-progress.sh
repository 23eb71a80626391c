# Sourced by hack/cluster and hack/epp (each defines `log`). Go's own output during a cold build is a few hundred
# `go: downloading` lines, then nothing for minutes while packages compile; this turns both into a line every
# 30 s saying what is being done, how far along and for how long.

# go_progress WHAT UNIT [TOTAL] < go's output (with -v for builds): counts the modules go downloads and the
# packages `go build -v` names as it compiles them, says every 30 s and at the end "WHAT: N [of TOTAL] UNIT,
# 2 min 30 s", drops go's other bookkeeping lines and passes every other line (errors) through to stderr.
go_progress() {
  local what="$1" unit="$2" total="${3:+ of $3}" count=0 start=$SECONDS next=$((SECONDS + 30)) line status
  while :; do
    if IFS= read -r -t 5 line; then
      case "$line" in
        "go: downloading "*) ((++count)) ;;
        "go: added "* | "go: upgraded "* | "go: finding "* | "go: found "*) ;;
        "" | "#"* | *[[:space:]]*) printf '%s\n' "$line" >&2 ;;
        *) ((++count)) ;;  # a package path: `go build -v` names each package it compiles (not the cached ones)
      esac
    else
      status=$?
      ((status > 128)) || break  # end of input; above 128 is read's 5 s timeout, there only to keep time
    fi
    if ((SECONDS >= next)); then
      log "$what: $count$total $unit, $(elapsed_since "$start")"
      next=$((SECONDS + 30))
    fi
  done
  log "$what: $count$total $unit in $(elapsed_since "$start")"
}

elapsed_since() { local s=$((SECONDS - $1)); printf '%d min %02d s' $((s / 60)) $((s % 60)); }
