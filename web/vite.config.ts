// The console's build: into fleet-core's package data, which the gateway serves at / (ADR 0012).
// `make web-dev` runs the dev server: /v1 and the gateway's /api/v1/requests go to the gateway,
// every other /api call to the control plane (FLEET_DEV_GATEWAY, FLEET_DEV_API override them).
import { defineConfig } from "vitest/config";
import react from "@vitejs/plugin-react";

const gateway = process.env.FLEET_DEV_GATEWAY ?? "http://127.0.0.1:8080";
const controlPlane = process.env.FLEET_DEV_API ?? "http://127.0.0.1:8081";

export default defineConfig({
  plugins: [react()],
  build: {
    outDir: "../fleet-core/src/fleet_core/gateway/console/static",
    emptyOutDir: true,
    chunkSizeWarningLimit: 1500,
  },
  server: {
    host: "127.0.0.1",
    port: 5173,
    strictPort: true,
    proxy: {
      "/v1": gateway,
      "/health": gateway,
      "/api/v1/requests": gateway,
      "/api": controlPlane,
    },
  },
  test: { include: ["tests/unit/**/*.test.ts"] },
});
