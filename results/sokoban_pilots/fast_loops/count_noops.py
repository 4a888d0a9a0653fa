"""Counts the moves that leave the board unchanged in `seed_jax.play --verbose` output.

  python results/sokoban_pilots/fast_loops/count_noops.py results/sokoban_pilots/fast_loops/play_grpo_seed0.txt

An episode that ends before the 6-turn limit is counted as won (the puzzles here: 2-3 moves,
6 turns). For the failed episodes: how many of the moves after the first left the board as
it was (a move into a wall, or a push against one), i.e. the policy repeating itself on an
unchanged prompt (`env.history_length` 0).
"""
import re,collections,sys
txt=open(sys.argv[1]).read().split('\n')
eps=collections.defaultdict(list); cur=None
for l in txt:
    m=re.match(r'\[sokoban-\w+-(\d+)\] (\d+)> (\S+)',l)
    if m: cur=[int(m.group(1)),m.group(3),l.split('> ',1)[1].split(' ',1)[1] if ' ' in l.split('> ',1)[1] else '']; eps[cur[0]].append([cur[1],[]]); continue
    if cur is not None and re.match(r'^\s*[#_OXP√S]{6}$', l.strip()) and len(l.strip())==6:
        eps[cur[0]][-1][1].append(l.strip())
noop=tot=0; fails=0; fail_noop=0; fail_tot=0
for k,steps in eps.items():
    boards=[tuple(b[-6:]) for _,b in steps]
    n=sum(1 for i in range(1,len(boards)) if boards[i]==boards[i-1])
    won=len(steps)<6
    if not won: fails+=1; fail_noop+=n; fail_tot+=len(steps)-1
print('failed episodes', fails, 'no-op moves among their steps 2..6:', fail_noop, '/', fail_tot)
