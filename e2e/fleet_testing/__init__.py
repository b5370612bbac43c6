"""Fleet's shared real-service test harness, one definition of each helper (STYLE §6: no fakes).

- `ports`: loopback ports for servers started later (below the ephemeral range, never twice);
- `waiting`: `eventually` (and its blocking twin) and `until_answers`, the one way to wait;
- `servers`: PostgreSQL and Redis found or started (environment, running, embedded, container);
  `databases`: a scratch database on one; `fix_s3`: SeaweedFS; `fix_kube`: etcd, kube-apiserver
  and kube-controller-manager; `engines`: llama.cpp's ``llama-server`` on a real model;
- `processes`: Fleet's own servers as processes (control plane, gateway, stub engine, hub);
  `asgi`: an app served in process over loopback (`serving`, `control_plane_app`);
- `fix_*`: the pytest fixtures over them, which each package's tests load by name through
  `plugins`; `fleet_system` and `node`: the whole system for the end-to-end test, on a real node.
"""
