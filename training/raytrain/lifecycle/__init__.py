"""How an attempt (or a worker group) ends, in one place: the endings, the one exception that carries one, and the
table of what happens when each comes (raytrain.lifecycle.endings). Every other room reads its decisions from here.

May import: nothing
"""
