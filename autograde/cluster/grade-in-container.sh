#!/usr/bin/env bash
# Grade a class on a machine without bubblewrap (macOS, Windows, or Linux without it) in the course's
# container image, with Podman or Docker: the same batch command, the sandbox inside the container. The
# instructor's guide on the course website, "Grading from macOS or Windows", gives the command this
# script runs, for typing it by hand (Windows' PowerShell included).
#
#   bash autograde/cluster/grade-in-container.sh DOWNLOADS CLASS_DIR [batch options, e.g. --jobs 2]
#   bash autograde/cluster/grade-in-container.sh --print DOWNLOADS CLASS_DIR ...   (print it, run nothing)
#
#   ENGINE             podman or docker (default: podman if it is installed, else docker)
#   IMAGE              the image built from autograde/cluster/Dockerfile (default: course-grader)
#   SECRET_DIR         where the class's secret (hidden-inputs.key) is kept between runs
#                      (default: ~/.config/transformer-course)
#   CACHE_DIR          Multi30k and its tokens, downloaded once (default: ~/.cache/transformer_course)
#   CONTAINER_OPTIONS  more options for `run`, split at spaces (e.g. "--cpus 4 --memory 16g")
#   PYTHON_IN_IMAGE    the image's Python (default: python)
set -euo pipefail
print=""
if [ "${1:-}" = "--print" ]; then
    print=yes
    shift
fi
if [ $# -lt 2 ]; then
    sed -n '7,8p' "$0" >&2
    exit 64
fi
downloads=$1 class=$2
shift 2
if [ -n "${ENGINE:-}" ]; then
    read -ra engine <<< "$ENGINE"
elif command -v podman >/dev/null; then
    engine=(podman)
else
    engine=(docker)
fi
read -ra image <<< "${IMAGE:-course-grader}"
read -ra extra <<< "${CONTAINER_OPTIONS:-}"
secrets="${SECRET_DIR:-$HOME/.config/transformer-course}"
cache="${CACHE_DIR:-$HOME/.cache/transformer_course}"
absolute() { mkdir -p "$1" && (cd "$1" && pwd); }
if [ -z "$print" ]; then
    [ -d "$downloads" ] || { echo "error: $downloads is not a folder" >&2; exit 2; }
    downloads=$(cd "$downloads" && pwd) class=$(absolute "$class") secrets=$(absolute "$secrets") cache=$(absolute "$cache")
fi

command=("${engine[@]}" run --rm
    # what bubblewrap needs in a container: no seccomp filter or AppArmor profile that refuses unshare and
    # mount, and a /proc that is not masked, so that it can mount a fresh one for each student's sandbox
    --security-opt seccomp=unconfined --security-opt apparmor=unconfined --security-opt systempaths=unconfined)
if [ "$(basename "${engine[0]}")" = podman ] && [ "$(id -u)" != 0 ]; then
    # rootless Podman (as on macOS and Windows): the image's user (uid 1000) writes your folders as you
    command+=("--userns=keep-id:uid=1000,gid=1000")
fi
command+=(${extra[@]+"${extra[@]}"}
    -v "$downloads:/downloads:ro" -v "$class:/class" -v "$secrets:/secret"
    -v "$cache:/home/grader/.cache/transformer_course"
    "${image[@]}" "${PYTHON_IN_IMAGE:-python}" -m transformer_course.grading.batch /downloads --class-dir /class
    --secret-file /secret/hidden-inputs.key "$@")
if [ -n "$print" ]; then
    printf '%q ' "${command[@]}"
    echo
    exit 0
fi
exec "${command[@]}"
