set terminal svg size 1500,480 noenhanced font "sans,11" background rgb "white"
set output "docs/results/long_context_gemma3.svg"
set multiplot layout 1,3 title "Gemma 3 270M Q4_K_M, real prefill, 2 threads, F16 KV"
set logscale x 2
set xrange [1699:39976]
set xtics (2048, 4096, 8192, 16384, 32768)
set xlabel "context tokens"
set key below horizontal
set grid
set yrange [0:*]
set ylabel "decode tokens/s"
set title "decode speed after the context"
plot "docs/results/long_context_gemma3.dat" index 0 using 1:2 with linespoints title "full", "" index 1 using 1:2 with linespoints title "keep 0.2", "" index 2 using 1:2 with linespoints title "keep 0.1", "" index 3 using 1:2 with linespoints title "llama.cpp full"
set ylabel "peak RSS MiB"
set title "peak resident memory"
plot "docs/results/long_context_gemma3.dat" index 0 using 1:3 with linespoints title "full", "" index 1 using 1:3 with linespoints title "keep 0.2", "" index 2 using 1:3 with linespoints title "keep 0.1", "" index 3 using 1:3 with linespoints title "llama.cpp full"
set ylabel "peak KV MiB"
set title "peak KV cache bytes"
plot "docs/results/long_context_gemma3.dat" index 0 using 1:4 with linespoints title "full", "" index 1 using 1:4 with linespoints title "keep 0.2", "" index 2 using 1:4 with linespoints title "keep 0.1", "" index 3 using 1:4 with linespoints title "llama.cpp full"
unset multiplot
