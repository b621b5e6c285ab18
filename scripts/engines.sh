#!/usr/bin/env bash
# `make engines`: installs the real engines the engine tests and benchmarks run on, from the
# package registries only, matched to the installed Beam Python SDK (pipelines/engines.py says
# where each goes and how a pipeline selects it):
#   - Prism, Beam's portable runner in Go: `go install` of its command at the SDK's release tag,
#     from the Go module proxy.
#   - Beam's Flink job server jar (embedded Flink cluster): `mvn dependency:copy` from Maven
#     Central, newest Flink version the SDK supports first. Optional: when Maven does not serve
#     it, this says so and goes on (the Flink tests then skip with that reason).
# Idempotent and cached: what is already installed is skipped; downloads and build caches stay in
# $ESA_ENGINES_DIR (default .engines/, ignored by git).
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PY:-.venv/bin/python}
DIR=${ESA_ENGINES_DIR:-$PWD/.engines}
mkdir -p "$DIR/bin" "$DIR/flink"
BEAM=$("$PY" -c 'from apache_beam.version import __version__; print(__version__)' 2>/dev/null)
say() { echo "engines: $*"; }

# --- Prism ---------------------------------------------------------------------------------
PRISM="$DIR/bin/prism-v$BEAM"
if [[ -x "$PRISM" ]]; then
    say "prism v$BEAM already installed ($PRISM)"
elif ! command -v go >/dev/null; then
    say "cannot build prism: no go command (install Go 1.23 or newer)" >&2
    exit 1
else
    say "building prism v$BEAM with go install (module download and build, about a minute)"
    started=$(date +%s)
    # -modcacherw: the module cache stays removable with rm -rf; GOTOOLCHAIN=local: never fetch a
    # toolchain (only the module proxy is reachable).
    GOMODCACHE="$DIR/go/mod" GOCACHE="$DIR/go/cache" GOBIN="$DIR/go/bin" \
        GOFLAGS=-modcacherw GOTOOLCHAIN=local \
        go install "github.com/apache/beam/sdks/v2/go/cmd/prism@v$BEAM"
    mv "$DIR/go/bin/prism" "$PRISM"
    say "prism v$BEAM built in $(($(date +%s) - started)) s: $PRISM"
fi

# --- Flink job server ----------------------------------------------------------------------
existing=$(ls "$DIR/flink/"beam-runners-flink-*-job-server-"$BEAM".jar 2>/dev/null | tail -1 || true)
unavailable="$DIR/flink/unavailable-$BEAM.txt"  # Maven's earlier answer; delete it to ask again
find "$DIR/flink" -name 'unavailable-*.txt' -mtime +6 -delete  # ask again after a week
if [[ -n "$existing" ]]; then
    say "flink job server already installed ($existing)"
elif [[ -f "$unavailable" ]]; then
    say "flink job server: Maven served none for Beam $BEAM when asked (remove $unavailable to ask again):"
    sed 's/^/    /' "$unavailable"
elif ! command -v mvn >/dev/null; then
    say "no mvn command: Flink job server not installed (Flink tests will skip)"
else
    versions=$("$PY" -c 'from apache_beam.options.pipeline_options import FlinkRunnerOptions as o
print(" ".join(reversed(o.PUBLISHED_FLINK_VERSIONS)))' 2>/dev/null)
    installed=""
    : >"$unavailable.tmp"
    for flink in $versions; do
        artifact="org.apache.beam:beam-runners-flink-$flink-job-server:$BEAM:jar"
        log="$DIR/flink/mvn-$flink.log"
        command=(mvn -B -q -U "-Dmaven.repo.local=$DIR/m2" dependency:copy "-Dartifact=$artifact"
            "-DoutputDirectory=$DIR/flink")
        if "${command[@]}" >"$log" 2>&1; then
            installed="$artifact"
            say "flink job server $artifact installed in $DIR/flink"
            break
        fi
        reason=$(grep -m1 -oE "(Unable to find|Could not find|Could not resolve|Could not transfer).*" "$log" \
            | sed -E 's# \(?https?://[^ )]*\)?##g; s#\. This failure.*##' || true)
        echo "$(date -u +%FT%TZ) ${command[*]}: ${reason:-failed, see $log}" | tee -a "$unavailable.tmp"
    done
    if [[ -z "$installed" ]]; then
        mv "$unavailable.tmp" "$unavailable"
        say "no Beam $BEAM Flink job server jar is served by Maven: Flink tests will skip"
    else
        rm -f "$unavailable.tmp"
    fi
fi
