set terminal svg size 1100,760 dynamic noenhanced font 'Helvetica,12' background rgb 'white'
set output 'docs/results/stories260K.eval.svg'
set multiplot layout 2,2 title 'stories260K.bin: 64 eval windows of tinystories_valid.txt (384+128 tokens)'
set grid
set key below horizontal height 1
set xtics 0.1
set logscale y
set format y '%g'
$q_h2o_uniform << EOD
0.1 0.0325089
0.2 0.023127
0.3 0.0166019
0.5 0.00879342
EOD
$q_h2o_pyramid << EOD
0.1 0.036128
0.2 0.0331719
0.3 0.0321463
0.5 0.0298388
EOD
$q_h2o_proportional << EOD
0.1 0.0366968
0.2 0.0383184
0.3 0.0303243
0.5 0.00950124
EOD
$q_h2o_middle << EOD
0.1 0.0351848
0.2 0.0332577
0.3 0.0321735
0.5 0.0220899
EOD
$q_h2o_optimal << EOD
0.1 0.0262191
0.2 0.0122139
0.3 0.00528447
0.5 0.00166475
EOD
set title 'quality vs budget (h2o scorer)'
set xlabel 'global keep ratio'
set ylabel 'mean KL(full || pruned)'
plot $q_h2o_uniform using 1:2 with linespoints lw 2 title 'uniform', $q_h2o_pyramid using 1:2 with linespoints lw 2 title 'pyramid', $q_h2o_proportional using 1:2 with linespoints lw 2 title 'proportional', $q_h2o_middle using 1:2 with linespoints lw 2 title 'middle', $q_h2o_optimal using 1:2 with linespoints lw 2 title 'optimal'
$s_h2o_0 << EOD
0.05 0.00294266
0.1 0.00266685
0.2 0.00199541
0.3 0.00125202
0.5 0.000384413
0.75 9.00666e-05
EOD
$s_h2o_1 << EOD
0.05 0.00202029
0.1 0.0008341
0.2 0.000570162
0.3 0.000492404
0.5 0.000225888
0.75 2.53078e-05
EOD
$s_h2o_2 << EOD
0.05 0.00891702
0.1 0.00537538
0.2 0.00230217
0.3 0.00200348
0.5 0.000966443
0.75 0.000303724
EOD
$s_h2o_3 << EOD
0.05 0.00395373
0.1 0.0020463
0.2 0.000999898
0.3 0.00028765
0.5 0.000115929
0.75 3.56629e-05
EOD
$s_h2o_4 << EOD
0.05 0.0424501
0.1 0.0359353
0.2 0.0187719
0.3 0.0146022
0.5 0.00789121
0.75 0.00464622
EOD
set title 'per-layer sensitivity (only that layer pruned, h2o)'
set ylabel 'mean kl (calibration windows)'
set xlabel 'keep ratio of that layer'
plot $s_h2o_0 using 1:2 with linespoints lw 2 title 'layer 0', $s_h2o_1 using 1:2 with linespoints lw 2 title 'layer 1', $s_h2o_2 using 1:2 with linespoints lw 2 title 'layer 2', $s_h2o_3 using 1:2 with linespoints lw 2 title 'layer 3', $s_h2o_4 using 1:2 with linespoints lw 2 title 'layer 4'
$q_snapkv_uniform << EOD
0.1 0.0215714
0.2 0.00735741
0.3 0.00252891
0.5 0.000922865
EOD
$q_snapkv_pyramid << EOD
0.1 0.0346108
0.2 0.0307976
0.3 0.0282288
0.5 0.0260058
EOD
$q_snapkv_proportional << EOD
0.1 0.0326563
0.2 0.033428
0.3 0.014605
0.5 0.000839041
EOD
$q_snapkv_middle << EOD
0.1 0.0332075
0.2 0.0319415
0.3 0.0318677
0.5 0.00776137
EOD
$q_snapkv_optimal << EOD
0.1 0.0127931
0.2 0.00342447
0.3 0.00107472
0.5 0.000175108
EOD
set title 'quality vs budget (snapkv scorer)'
set xlabel 'global keep ratio'
set ylabel 'mean KL(full || pruned)'
plot $q_snapkv_uniform using 1:2 with linespoints lw 2 title 'uniform', $q_snapkv_pyramid using 1:2 with linespoints lw 2 title 'pyramid', $q_snapkv_proportional using 1:2 with linespoints lw 2 title 'proportional', $q_snapkv_middle using 1:2 with linespoints lw 2 title 'middle', $q_snapkv_optimal using 1:2 with linespoints lw 2 title 'optimal'
$s_snapkv_0 << EOD
0.05 0.00294266
0.1 0.00110824
0.2 0.000225243
0.3 7.38252e-05
0.5 1.74052e-05
0.75 5.35068e-06
EOD
$s_snapkv_1 << EOD
0.05 0.00202029
0.1 0.000547577
0.2 7.96662e-05
0.3 2.79483e-05
0.5 1.28708e-05
0.75 1.49707e-06
EOD
$s_snapkv_2 << EOD
0.05 0.00891702
0.1 0.00456312
0.2 0.00110451
0.3 0.000354317
0.5 0.000110044
0.75 5.53823e-05
EOD
$s_snapkv_3 << EOD
0.05 0.00395373
0.1 0.00126408
0.2 6.61053e-05
0.3 3.30825e-05
0.5 8.85984e-06
0.75 2.86637e-06
EOD
$s_snapkv_4 << EOD
0.05 0.0424501
0.1 0.0177346
0.2 0.0050603
0.3 0.00272216
0.5 0.000771159
0.75 0.000162281
EOD
set title 'per-layer sensitivity (only that layer pruned, snapkv)'
set ylabel 'mean kl (calibration windows)'
set xlabel 'keep ratio of that layer'
plot $s_snapkv_0 using 1:2 with linespoints lw 2 title 'layer 0', $s_snapkv_1 using 1:2 with linespoints lw 2 title 'layer 1', $s_snapkv_2 using 1:2 with linespoints lw 2 title 'layer 2', $s_snapkv_3 using 1:2 with linespoints lw 2 title 'layer 3', $s_snapkv_4 using 1:2 with linespoints lw 2 title 'layer 4'
unset multiplot
