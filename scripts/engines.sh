#!/usr/bin/env bash
# `make engines`: installs the real engines the engine tests and benchmarks run on, from the
# package registries only (pipelines/engines/runners.py says where each goes and how a pipeline selects it):
#   - Prism, Beam's portable runner in Go: `go install` of its command at the SDK's release tag,
#     from the Go module proxy.
#   - Beam's Flink job server: Beam's published job server jar for the installed SDK when Maven
#     serves it; otherwise the job server ASSEMBLED from Maven Central: `mvn
#     dependency:copy-dependencies` of the Beam Flink runner module (which holds the job server's
#     main class, FlinkJobServerDriver) at the newest Beam release whose runner resolves with all its
#     dependencies ($FLINK_RUNNER below), plus a launcher jar whose manifest names that main
#     class, the dependency jars (Class-Path) and the module openings Flink needs on Java 17
#     (Add-Opens). The same jars start a standalone Flink JobManager and TaskManager
#     (pipelines/engines/flink_cluster.py). Optional: when Maven serves neither, this says so and goes on
#     (the Flink tests then skip with that reason).
# Idempotent and cached: what is already installed is skipped; downloads and build caches stay in
# $ESA_ENGINES_DIR (default .engines/, ignored by git).
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PY:-.venv/bin/python}
DIR=${ESA_ENGINES_DIR:-$PWD/.engines}
mkdir -p "$DIR/bin" "$DIR/flink"
BEAM=$("$PY" -c 'from apache_beam.version import __version__; print(__version__)' 2>/dev/null)
# The Beam Flink runner assembled when no job server jar is published for $BEAM: <beam>:<flink>.
# Maven Central serves beam-runners-flink-1.19 at 2.62.0 and 2.70.0 only, and 2.70.0's
# beam-runners-java-job-service is not served (checked 2026-11-24), so 2.62.0 on Flink 1.19.0.
# The portable job API it speaks is the one the installed SDK submits to (tests/engines compare
# every result with FnApiRunner's).
FLINK_RUNNER=${ESA_FLINK_RUNNER:-2.62.0:1.19}
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
    # Its "go: downloading" lines go to a log, shown only if the build fails.
    if ! GOMODCACHE="$DIR/go/mod" GOCACHE="$DIR/go/cache" GOBIN="$DIR/go/bin" \
        GOFLAGS=-modcacherw GOTOOLCHAIN=local \
        go install "github.com/apache/beam/sdks/v2/go/cmd/prism@v$BEAM" >"$DIR/go-install.log" 2>&1; then
        tail -20 "$DIR/go-install.log" >&2
        say "prism v$BEAM failed to build (log: $DIR/go-install.log)" >&2
        exit 1
    fi
    mv "$DIR/go/bin/prism" "$PRISM"
    say "prism v$BEAM built in $(($(date +%s) - started)) s: $PRISM"
fi

# --- Flink job server ----------------------------------------------------------------------
published=$(ls "$DIR/flink/"beam-runners-flink-*-job-server-"$BEAM".jar 2>/dev/null | tail -1 || true)
runner_beam=${FLINK_RUNNER%%:*}
runner_flink=${FLINK_RUNNER##*:}
assembled_dir="$DIR/flink/assembled-$runner_beam-$runner_flink"
assembled="$assembled_dir/beam-runners-flink-$runner_flink-job-server-$runner_beam.jar"
unavailable="$DIR/flink/unavailable-$BEAM.txt"  # Maven's earlier answer; delete it to ask again
find "$DIR/flink" -name 'unavailable-*.txt' -mtime +6 -delete  # ask again after a week
if [[ -n "$published" ]]; then
    say "flink job server already installed ($published)"
elif [[ -f "$assembled" ]]; then
    say "flink job server (Beam $runner_beam Flink runner, assembled) already installed ($assembled)"
elif ! command -v mvn >/dev/null || ! command -v java >/dev/null; then
    say "no mvn or java command: Flink job server not installed (Flink tests will skip)"
else
    if [[ ! -f "$unavailable" ]]; then
        # 1. Beam's published job server jar for this SDK, newest Flink first.
        versions=$("$PY" -c 'from apache_beam.options.pipeline_options import FlinkRunnerOptions as o
print(" ".join(reversed(o.PUBLISHED_FLINK_VERSIONS)))' 2>/dev/null)
        : >"$unavailable.tmp"
        for flink in $versions; do
            artifact="org.apache.beam:beam-runners-flink-$flink-job-server:$BEAM:jar"
            log="$DIR/flink/mvn-$flink.log"
            command=(mvn -B -q -U "-Dmaven.repo.local=$DIR/m2" dependency:copy "-Dartifact=$artifact"
                "-DoutputDirectory=$DIR/flink")
            if "${command[@]}" >"$log" 2>&1; then
                published="$DIR/flink/beam-runners-flink-$flink-job-server-$BEAM.jar"
                say "flink job server $artifact installed in $DIR/flink"
                break
            fi
            reason=$(grep -m1 -oE "(Unable to find|Could not find|Could not resolve|Could not transfer).*" "$log" \
                | sed -E 's# \(?https?://[^ )]*\)?##g; s#\. This failure.*##' || true)
            echo "$(date -u +%FT%TZ) ${command[*]}: ${reason:-failed, see $log}" >>"$unavailable.tmp"
        done
        if [[ -z "$published" ]]; then
            mv "$unavailable.tmp" "$unavailable"
            say "no Beam $BEAM Flink job server jar is served by Maven ($unavailable); assembling one"
        else
            rm -f "$unavailable.tmp"
        fi
    fi
    if [[ -z "$published" ]]; then
        # 2. Assemble the job server from the Beam Flink runner and its dependencies.
        say "assembling the Flink job server: org.apache.beam:beam-runners-flink-$runner_flink:$runner_beam and its dependencies (about 150 MB)"
        started=$(date +%s)
        rm -rf "$assembled_dir.tmp" && mkdir -p "$assembled_dir.tmp"
        cat >"$assembled_dir.tmp/pom.xml" <<POM
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>esa.engines</groupId>
  <artifactId>flink-job-server</artifactId>
  <version>$runner_beam</version>
  <dependencies>
    <dependency>
      <groupId>org.apache.beam</groupId>
      <artifactId>beam-runners-flink-$runner_flink</artifactId>
      <version>$runner_beam</version>
    </dependency>
  </dependencies>
</project>
POM
        log="$DIR/flink/mvn-assemble.log"
        if (cd "$assembled_dir.tmp" && mvn -B -q "-Dmaven.repo.local=$DIR/m2" \
                dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory=lib) >"$log" 2>&1 \
            && slf4j=$(ls "$assembled_dir.tmp/lib/" | sed -nE 's/^slf4j-api-(.*)\.jar$/\1/p' | head -1) \
            && mvn -B -q "-Dmaven.repo.local=$DIR/m2" dependency:copy \
                "-Dartifact=org.slf4j:slf4j-simple:$slf4j:jar" "-DoutputDirectory=$assembled_dir.tmp/logging" \
                >>"$log" 2>&1 \
            && "$PY" -m pipelines.engines.flink_cluster launcher "$assembled_dir.tmp" \
                "beam-runners-flink-$runner_flink-job-server-$runner_beam.jar"; then
            rm -rf "$assembled_dir" && mv "$assembled_dir.tmp" "$assembled_dir"
            say "flink job server assembled in $(($(date +%s) - started)) s: $assembled"
        else
            reason=$(grep -m1 -oE "(Could not find|Could not resolve|Could not transfer).*" "$log" \
                | sed -E 's# \(?https?://[^ )]*\)?##g' || true)
            say "could not assemble the Flink job server: ${reason:-see $log} (Flink tests will skip)"
            rm -rf "$assembled_dir.tmp"
        fi
    fi
fi

# --- The assembled job server's own main class -----------------------------------------------
# pipelines/engines/flink_job_server/PrestagedJobServer.java, compiled against the assembled jars
# into lib/esa-prestaged-job-server-<source digest>.jar: jobs to a cluster that holds lib/ stage
# none of it (pipelines/engines/flink_cluster.py). Rebuilt when the source changes; when it cannot
# be built the launcher keeps Beam's main class and each job stages lib/ (about 15 s more).
if [[ -f "$assembled" ]]; then
    source=pipelines/engines/flink_job_server/PrestagedJobServer.java
    digest=$(sha256sum "$source" | cut -c1-16)
    prestaged="$assembled_dir/lib/esa-prestaged-job-server-$digest.jar"
    if [[ -f "$prestaged" ]]; then
        say "flink job server main class already built ($prestaged)"
    elif ! command -v javac >/dev/null || ! command -v jar >/dev/null; then
        say "no javac or jar command: Flink jobs stage the job server's jars (about 15 s each)"
    else
        classes=$(mktemp -d)
        log="$DIR/flink/javac.log"
        if javac -nowarn -d "$classes" -cp "$assembled_dir/lib/*" "$source" >"$log" 2>&1 \
            && jar cf "$prestaged.tmp" -C "$classes" . >>"$log" 2>&1; then
            rm -f "$assembled_dir"/lib/esa-prestaged-job-server-*.jar
            mv "$prestaged.tmp" "$prestaged"
            "$PY" -m pipelines.engines.flink_cluster launcher "$assembled_dir" "$(basename "$assembled")"
            say "flink job server main class built: $prestaged"
        else
            rm -f "$prestaged.tmp"
            say "could not compile $source (see $log): Flink jobs stage the job server's jars"
        fi
        rm -rf "$classes"
    fi
fi
