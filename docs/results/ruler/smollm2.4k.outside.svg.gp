set terminal svg size 1500,560 dynamic noenhanced font 'sans,11' background rgb 'white'
set output 'smollm2.4k.outside.svg'
set xrange [0.22:0.905]
set multiplot layout 1,2 title 'RULER-style tasks, outside protocol: mean string_match_all x 100 over the tasks against compression (every cell: smollm2.4k.outside.md)'
set xlabel 'compression (fraction of the context removed)'
set ylabel 'mean score'
set yrange [-5:105]
set key below Left reverse horizontal maxcols 4 font ',9'
set grid
set title 'SmolLM2-135M-Instruct.Q4_1.gguf 4096 tokens: depthkv'
plot 'smollm2.4k.outside.dat' index 0 with lp lw 2 dt 2 pt 1 lc rgb 'gray40' title 'full', 'smollm2.4k.outside.dat' index 1 with lp lw 2 pt 5 dt 1 title 'snapkv', 'smollm2.4k.outside.dat' index 2 with lp lw 2 pt 6 dt 1 title 'snapkv-span', 'smollm2.4k.outside.dat' index 3 with lp lw 2 pt 7 dt 1 title 'tova', 'smollm2.4k.outside.dat' index 4 with lp lw 2 pt 8 dt 1 title 'keydiff', 'smollm2.4k.outside.dat' index 5 with lp lw 2 pt 9 dt 1 title 'optimal', 'smollm2.4k.outside.dat' index 6 with lp lw 2 pt 10 dt 1 title 'keydiff-optimal', 'smollm2.4k.outside.dat' index 7 with lp lw 3 pt 7 ps 1.2 lc rgb 'black' title 'preset'
set title 'SmolLM2-135M-Instruct.Q4_1.gguf 4096 tokens: kvpress presses, depthkv preset, full cache'
plot 'smollm2.4k.outside.dat' index 8 with lp lw 2 pt 4 dt 3 title 'kvpress-keydiff', 'smollm2.4k.outside.dat' index 9 with lp lw 2 pt 5 dt 3 title 'kvpress-tova', 'smollm2.4k.outside.dat' index 10 with lp lw 2 pt 6 dt 3 title 'kvpress-streamingllm', 'smollm2.4k.outside.dat' index 11 with lp lw 2 pt 7 dt 3 title 'kvpress-depthkv', 'smollm2.4k.outside.dat' index 12 with lp lw 2 pt 8 dt 3 title 'kvpress-expected-attention', 'smollm2.4k.outside.dat' index 13 with lp lw 2 pt 9 dt 3 title 'kvpress-adakv', 'smollm2.4k.outside.dat' index 14 with lp lw 2 dt 2 pt 1 lc rgb 'gray40' title 'full', 'smollm2.4k.outside.dat' index 15 with lp lw 3 pt 7 ps 1.2 lc rgb 'black' title 'preset'
unset multiplot
