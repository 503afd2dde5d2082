# Round 54 call 5 (.peer in carry; COMMIT=<sha> bash docs/gpu/round54/call5/command.sh): call 3's command again
# (issue 23's benchmark at the heads-first kernels), for how far fla's times and the taps pairs move between calls.
bash docs/gpu/round54/call3/command.sh
