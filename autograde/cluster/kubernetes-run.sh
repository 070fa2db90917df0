#!/usr/bin/env bash
# Grade a class on Kubernetes from start to end: the grading Job (kubernetes-job.yaml), then, once it has
# ended (Complete, or Failed because an index used up its retries: the others' scores still count), the
# final scores Job (kubernetes-scores.yaml), run once. Kubernetes has no dependency between Jobs, so this
# script waits in between, as Slurm's --dependency=afterany does. From the course's folder:
#
#   DOWNLOADS=~/downloads/week2 RESULTS=~/grading/week2 bash autograde/cluster/kubernetes-run.sh [POLL_SECONDS]
#
# DOWNLOADS (optional) is a folder on this machine: this week's downloads, copied onto the shared volume's
# /shared/downloads before grading (added to the earlier weeks' files; a file of the same name is replaced).
# RESULTS (optional) is a folder on this machine: scores.csv, report.html and feedback/ are copied there from
# /shared/class once the scores Job completed. Both copies go through the pod kubernetes-copy.yaml makes,
# deleted after each.
#
# Every run creates new Jobs (the manifests have generateName: grade-class-XXXXX, grade-class-scores-XXXXX),
# so running it again next week grades the students handed in since. It stops with exit status 1, saying
# why, when the shared volume, the gradebook secret or the class's secret (hidden-inputs) is missing, when
# DOWNLOADS is not a folder, and when no pod of a Job has started
# after START_TIMEOUT seconds (default 600: pods Pending on a missing volume, an image that cannot be
# pulled, a node too small, a namespace whose Pod Security level refuses them): it prints each pod's
# reason (or the Job's events when no pod could be made) and deletes that Job. It ends with exit status 0
# when the scores Job completed, 1 otherwise.
#
# KUBECTL names the kubectl command (default: kubectl; e.g. "kubectl -n course-grading").
set -euo pipefail
absolute() { case "$1" in /*) echo "$1" ;; *) echo "$PWD/$1" ;; esac; }
downloads="${DOWNLOADS:+$(absolute "$DOWNLOADS")}" results="${RESULTS:+$(absolute "$RESULTS")}"
cd "$(dirname "$0")"
read -ra kubectl <<< "${KUBECTL:-kubectl}"
poll="${1:-30}"
start_timeout="${START_TIMEOUT:-600}"
guide="the instructor's guide, Grading on a cluster"

if ! "${kubectl[@]}" get pvc grading-shared -o name >/dev/null; then
    echo "error: the shared volume grading-shared does not exist here: kubectl apply -f" \
         "autograde/cluster/kubernetes-volume.yaml, then copy the downloads and Multi30k onto it ($guide)" >&2
    exit 1
fi
if ! "${kubectl[@]}" get secret gradebook -o name >/dev/null; then
    echo "error: the secret gradebook does not exist here: kubectl create secret generic gradebook" \
         "--from-literal=url=postgresql://grader:PASSWORD@dbhost/gradebook ($guide)" >&2
    exit 1
fi
if ! "${kubectl[@]}" get secret hidden-inputs -o name >/dev/null; then
    echo "error: the secret hidden-inputs does not exist here: the class's secret, which every grading pod draws" \
         "the hidden tests' inputs from (without it each pod would draw its own). Make it once from the class's" \
         "key file, the one you keep for the term (python -m transformer_course.grading.sandbox.hidden_inputs" \
         "makes one where there is none): kubectl create secret generic hidden-inputs" \
         "--from-file=hidden-inputs.key=\$HOME/.config/transformer-course/hidden-inputs.key ($guide)" >&2
    exit 1
fi
if [ -n "$downloads" ] && [ ! -d "$downloads" ]; then
    echo "error: DOWNLOADS=$downloads is not a folder on this machine" >&2
    exit 1
fi

copier=grading-shared-copy
copier_up() {  # the pod that holds the shared volume open for copies (kubernetes-copy.yaml), made afresh
    "${kubectl[@]}" delete pod "$copier" --ignore-not-found >/dev/null
    "${kubectl[@]}" apply -f kubernetes-copy.yaml >/dev/null
    if ! "${kubectl[@]}" wait --for=condition=Ready "pod/$copier" --timeout="${start_timeout}s" >/dev/null; then
        echo "error: the pod $copier, which copies files onto the shared volume, did not start in" \
             "$start_timeout s (START_TIMEOUT): kubectl describe pod $copier ($guide)" >&2
        "${kubectl[@]}" delete pod "$copier" --ignore-not-found --wait=false >&2 || true
        exit 1
    fi
}
copier_down() {
    "${kubectl[@]}" delete pod "$copier" --ignore-not-found --wait=false >/dev/null || true
}

ended() {  # the terminal condition of a Job (Complete or Failed), empty while it runs
    local state
    state=$("${kubectl[@]}" get job "$1" -o 'jsonpath={range .status.conditions[?(@.status=="True")]}{.type} {end}') \
        || return 1
    for condition in $state; do
        if [ "$condition" = Complete ] || [ "$condition" = Failed ]; then
            echo "$condition"
            return
        fi
    done
}

started() {  # whether a pod of the Job has started (is running or has run)
    local phases
    phases=$("${kubectl[@]}" get pods -l "job-name=$1" -o 'jsonpath={.items[*].status.phase}') || return 1
    case " $phases " in
        *" Running "* | *" Succeeded "* | *" Failed "*) return 0 ;;
    esac
    return 1
}

why_not_started() {  # each pod's phase and reason, and the Job's events (where a refused pod is told)
    local pods events
    pods=$("${kubectl[@]}" get pods -l "job-name=$1" -o 'jsonpath={range .items[*]}{.metadata.name}: {.status.phase}; {.status.conditions[?(@.type=="PodScheduled")].reason} {.status.conditions[?(@.type=="PodScheduled")].message} {.status.containerStatuses[*].state.waiting.reason} {.status.containerStatuses[*].state.waiting.message}{"\n"}{end}') || true
    events=$("${kubectl[@]}" get events --field-selector "involvedObject.kind=Job,involvedObject.name=$1" \
        -o 'jsonpath={range .items[*]}{.reason}: {.message}{"\n"}{end}') || true
    [ -n "$pods" ] && printf 'pods of job/%s:\n%s\n' "$1" "$pods"
    [ -n "$events" ] && printf 'events of job/%s:\n%s\n' "$1" "$events"
    [ -n "$pods$events" ] || echo "job/$1 has no pod and no event"
    case "$pods$events" in
        *"violates PodSecurity"*)
            echo "This namespace's Pod Security level refuses what bubblewrap needs in a pod (Unconfined seccomp" \
                 "and AppArmor, an unmasked /proc): grade in a namespace of its own, made by" \
                 "kubernetes-namespace.yaml, with KUBECTL=\"kubectl -n course-grading\" ($guide)." ;;
        *grading-shared*)
            echo "The shared volume grading-shared cannot be mounted: kubectl describe pvc grading-shared ($guide)." ;;
    esac
}

wait_for() {  # wait_for JOB: until it is Complete or Failed; gives up when no pod has started in time
    local state="" began=$SECONDS running=""
    while :; do
        state=$(ended "$1") || { echo "error: cannot read the state of job/$1" >&2; exit 1; }
        [ -n "$state" ] && break
        if [ -z "$running" ]; then
            if started "$1"; then
                running=yes
            elif (( SECONDS - began >= start_timeout )); then
                echo "error: no pod of job/$1 started in $start_timeout s (START_TIMEOUT)." >&2
                why_not_started "$1" >&2
                "${kubectl[@]}" delete job "$1" --ignore-not-found >&2 || true
                echo "job/$1 was deleted, so that it does not start later with nobody waiting for it." >&2
                exit 1
            fi
        fi
        sleep "$poll"
    done
    echo "job/$1: $state"
    [ "$state" = Complete ]
}

create() {  # create MANIFEST: a new Job from it; prints its name
    local created
    created=$("${kubectl[@]}" create -f "$1" -o name)
    echo "${created##*/}"
}

if [ -n "$downloads" ]; then
    copier_up
    COPYFILE_DISABLE=1 tar -C "$downloads" -cf - . | "${kubectl[@]}" exec -i "$copier" -- \
        sh -c 'mkdir -p /shared/downloads && tar -C /shared/downloads -xf -'
    copier_down
    echo "copied $downloads onto the shared volume (/shared/downloads)"
fi
grading=$(create kubernetes-job.yaml)
echo "job/$grading created: grading the class"
wait_for "$grading" || echo "job/$grading failed for some indexes: the others' scores still count" \
    "(kubectl logs job/$grading, or each pod's log)"
scores=$(create kubernetes-scores.yaml)
echo "job/$scores created: writing scores.csv and report.html"
if ! wait_for "$scores"; then
    echo "error: job/$scores did not write the scores; its log:" >&2
    "${kubectl[@]}" logs "job/$scores" --tail=40 >&2 || true
    exit 1
fi
if [ -n "$results" ]; then
    mkdir -p "$results"
    copier_up
    "${kubectl[@]}" exec "$copier" -- sh -c \
        'cd /shared/class && tar -cf - $(ls -d scores.csv report.html feedback 2>/dev/null)' | tar -C "$results" -xf -
    copier_down
    echo "copied scores.csv, report.html and feedback/ into $results"
fi
