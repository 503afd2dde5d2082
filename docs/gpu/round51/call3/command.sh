# Round 51 call 3: round 51 call 2's command again (COMMIT=0f32828 bash docs/gpu/round51/call2/command.sh,
# .peer in carry), asked of an H200; it ran on the H100 still held after call 2 (the same machine, warm:
# compiled kernels and fla's autotune results kept), so a repeat of call 2's benchmark there.
