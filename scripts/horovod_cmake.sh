#!/usr/bin/env bash
# cmake for Horovod's build (scripts/install.sh sets HOROVOD_CMAKE to this script): Horovod's setup.py configures a
# RelWithDebInfo build (-O2 -g, which its CMakeLists turns into -O3 -g); here the configure step gets the same flags
# without -g. Debug information roughly doubles what the compiler writes for Horovod's and Gloo's template-heavy
# sources and is not needed (the symbol table, which perf uses, stays). Every other call (--build, --version) is
# cmake's own.
set -euo pipefail
case "${1:-}" in
  --build | --version | -E | -P) exec cmake "$@" ;;
esac
exec cmake "$@" "-DCMAKE_C_FLAGS_RELWITHDEBINFO=-O2 -DNDEBUG" "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O2 -DNDEBUG"
