#!/bin/sh
# with_proc_modules.sh MODULES CMD [ARGS...]: exec CMD with a /proc that is the kernel's plus a
# `modules` file (MODULES), for a kernel built without loadable-module support, which has no
# /proc/modules for `mokka run` to cover (a procfs takes no new entry, and no overlay stacks on it).
#
# Run it inside a private mount namespace as root (under `mokka run`). /proc becomes a tmpfs whose
# every entry is a bind of the real one (so /proc/driver/nvidia keeps mokka run's binds), `self`
# and `thread-self` point at this shell's pid (the pid CMD runs as, after exec), and only that
# pid's directory is brought back: CMD sees itself, not the other processes.
set -eu
modules=$1
shift
real=$(mktemp -d)
new=$(mktemp -d)
mount --rbind /proc "$real"
mount -t tmpfs -o mode=0555 proc-with-modules "$new"
for entry in "$real"/*; do
  name=${entry##*/}
  case "$name" in
    [0-9]*) continue ;;
    self) ln -s "$$" "$new/self"; continue ;;
    thread-self) ln -s "$$/task/$$" "$new/thread-self"; continue ;;
  esac
  if [ -L "$entry" ]; then
    ln -s "$(readlink "$entry")" "$new/$name"
  elif [ -d "$entry" ]; then
    mkdir "$new/$name" && mount --rbind "$entry" "$new/$name"
  else
    : >"$new/$name" && mount --bind "$entry" "$new/$name"
  fi
done
mkdir "$new/$$" && mount --rbind "$real/$$" "$new/$$"
: >"$new/modules" && mount --bind "$modules" "$new/modules"
mount --rbind "$new" /proc
exec "$@"
