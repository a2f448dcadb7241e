"""Who is who: which holder of a GPU is this unit's, another service's, a GPU
daemon's or foreign (attribution), the start claims, the drain fence."""
