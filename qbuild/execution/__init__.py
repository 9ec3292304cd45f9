"""Running actions: the local sandboxed executor, declared actions, linked inputs,
and the Dask executor and its worker side.
"""
