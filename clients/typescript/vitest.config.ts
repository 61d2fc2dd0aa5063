import { defineConfig } from "vitest/config";

export default defineConfig({
  test: {
    include: ["test/**/*.test.ts"],
    globalSetup: ["test/sidecar.ts"],
    testTimeout: 60_000,
    hookTimeout: 60_000,
    // The validation suite registers global describe/it/expect; one sidecar serves every file.
    globals: true,
    fileParallelism: false,
  },
});
