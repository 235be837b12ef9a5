//! Node services: the sandbox manager (drives the lifecycle) and the node manager (every privileged operation).
