set terminal svg size 1400,1320 dynamic noenhanced font 'sans,11' background rgb 'white'
set output 'kvpress_peer_untouched.svg'
set multiplot layout 2,2 title 'Mean KL(full || pruned) against keep ratio, log scale (every row: docs/results/kvpress_peer_untouched.md)'
set logscale y
set format y '%g'
set xlabel 'keep ratio'
set ylabel 'mean KL(full || pruned)'
set key below Left reverse vertical maxcols 1 font ',9' spacing 1.1 height 1.5
set grid
set xtics ('0.1' 0.1, '0.2' 0.2, '0.3' 0.3, '0.5' 0.5)
set xrange [0.08:0.52]
set lmargin 10
set title 'stories260K: kvpress presses (the best 6 of the 11 with every keep)'
plot 'kvpress_peer_untouched.dat' index 0 with lp lw 1.5 dt 2 pt 4 title 'kvpress CriticalAdaKV+SnapKV', 'kvpress_peer_untouched.dat' index 1 with lp lw 1.5 dt 2 pt 6 title 'kvpress CriticalKV+SnapKV', 'kvpress_peer_untouched.dat' index 2 with lp lw 1.5 dt 2 pt 8 title 'kvpress AdaKV+SnapKV', 'kvpress_peer_untouched.dat' index 3 with lp lw 1.5 dt 2 pt 10 title 'kvpress SnapKV', 'kvpress_peer_untouched.dat' index 4 with lp lw 1.5 dt 2 pt 12 title 'kvpress StreamingLLM', 'kvpress_peer_untouched.dat' index 5 with lp lw 1.5 dt 2 pt 14 title 'kvpress TOVA', 'kvpress_peer_untouched.dat' index 6 with lp lw 3 pt 7 ps 1.2 lc rgb 'black' title 'depthkv --preset best'
set title 'stories260K: depthkv'
plot 'kvpress_peer_untouched.dat' index 7 with lp lw 3 pt 7 ps 1.2 lc rgb 'black' title 'depthkv --preset best', 'kvpress_peer_untouched.dat' index 8 with lp lw 2 pt 7 title 'depthkv h2o + output-aware + lookahead 32 uniform', 'kvpress_peer_untouched.dat' index 9 with lp lw 2 pt 7 title 'depthkv h2o + output-aware + lookahead 32 optimal', 'kvpress_peer_untouched.dat' index 10 with lp lw 2 pt 7 title 'depthkv snapkv uniform', 'kvpress_peer_untouched.dat' index 11 with lp lw 2 pt 7 title 'depthkv snapkv optimal', 'kvpress_peer_untouched.dat' index 12 with lp lw 2 dt 3 pt 5 title 'depthkv head-optimal budgets + kvpress SnapKV', 'kvpress_peer_untouched.dat' index 13 with lp lw 2 dt 3 pt 5 title 'kvpress LUKV+SnapKV (depthkv head curves)', 'kvpress_peer_untouched.dat' index 14 with lp lw 2 dt 2 pt 4 lc rgb 'red' title 'best kvpress press (per keep)'
set title 'aidreams260K: kvpress presses (the best 6 of the 11 with every keep)'
plot 'kvpress_peer_untouched.dat' index 15 with lp lw 1.5 dt 2 pt 4 title 'kvpress KeyDiff', 'kvpress_peer_untouched.dat' index 16 with lp lw 1.5 dt 2 pt 6 title 'kvpress ObservedAttention (H2O)', 'kvpress_peer_untouched.dat' index 17 with lp lw 1.5 dt 2 pt 8 title 'kvpress TOVA', 'kvpress_peer_untouched.dat' index 18 with lp lw 1.5 dt 2 pt 10 title 'kvpress CriticalAdaKV+SnapKV', 'kvpress_peer_untouched.dat' index 19 with lp lw 1.5 dt 2 pt 12 title 'kvpress AdaKV+SnapKV', 'kvpress_peer_untouched.dat' index 20 with lp lw 1.5 dt 2 pt 14 title 'kvpress CriticalKV+SnapKV', 'kvpress_peer_untouched.dat' index 21 with lp lw 3 pt 7 ps 1.2 lc rgb 'black' title 'depthkv --preset best'
set title 'aidreams260K: depthkv'
plot 'kvpress_peer_untouched.dat' index 22 with lp lw 3 pt 7 ps 1.2 lc rgb 'black' title 'depthkv --preset best', 'kvpress_peer_untouched.dat' index 23 with lp lw 2 pt 7 title 'depthkv h2o + output-aware + lookahead 32 uniform', 'kvpress_peer_untouched.dat' index 24 with lp lw 2 pt 7 title 'depthkv h2o + output-aware + lookahead 32 optimal', 'kvpress_peer_untouched.dat' index 25 with lp lw 2 pt 7 title 'depthkv snapkv uniform', 'kvpress_peer_untouched.dat' index 26 with lp lw 2 pt 7 title 'depthkv snapkv optimal', 'kvpress_peer_untouched.dat' index 27 with lp lw 2 dt 3 pt 5 title 'depthkv head-optimal budgets + kvpress SnapKV', 'kvpress_peer_untouched.dat' index 28 with lp lw 2 dt 3 pt 5 title 'kvpress LUKV+SnapKV (depthkv head curves)', 'kvpress_peer_untouched.dat' index 29 with lp lw 2 dt 2 pt 4 lc rgb 'red' title 'best kvpress press (per keep)'
unset multiplot
