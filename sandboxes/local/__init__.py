"""The local backends: LocalSandbox (a warm zygote forks each run) and BwrapSandbox (the same inside bubblewrap).

The zygote-side modules (zygote, child, isolation, repl, wire, outputs, compile_cache) are stdlib only and
import each other relatively: the zygote loads this folder as a private package, outside chatgym."""
