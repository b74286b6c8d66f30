"""Real host-resident streaming runtime. Not built yet: see the runtime issue; nothing here runs."""
