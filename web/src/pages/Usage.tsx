import { lazy, Suspense, useState } from "react";
import { Alert, Card, Segmented, Space, Spin, Table, Typography } from "antd";
import { api, type List } from "../lib/api";
import { percent } from "../lib/format";
import { useLoad } from "../lib/useLoad";
import { useSession } from "../session";

const UsageCharts = lazy(() => import("./UsageCharts"));

interface UsageRow {
  key: string;
  requests: number;
  tokensInput: number;
  tokensOutput: number;
  tokensCached: number;
  tokensFresh: number;
  units: number;
}
interface CountAgreement {
  meanRelativeDiff: number | null;
  p95AbsRelativeDiff: number | null;
}
interface Agreement {
  model: string;
  requests: number;
  compared: number;
  withoutEngineUsage: number;
  prompt: CountAgreement;
  completion: CountAgreement;
  countMethods: string[];
  outOfBounds: number;
}

const RANGES: Record<string, number> = { "24 h": 1, "7 days": 7, "30 days": 30 };

function label(key: string, group: string): string {
  if (group === "hour") return new Date(key).toISOString().slice(5, 16).replace("T", " ");
  if (group === "day") return key.slice(0, 10);
  return key;
}

export default function Usage() {
  const { token, who } = useSession();
  const [group, setGroup] = useState<string>("hour");
  const [range, setRange] = useState<string>("24 h");
  const from = new Date(Date.now() - RANGES[range] * 86400_000);
  from.setUTCMinutes(0, 0, 0);
  const query = `groupBy=${group}&from=${encodeURIComponent(from.toISOString())}`;
  const usage = useLoad(() => api<List<UsageRow>>(`/api/v1/usage?${query}`, { token }), [query, token]);
  const agreement = useLoad(
    () => (who.role === "tenant" ? Promise.resolve(undefined) : api<List<Agreement>>(`/api/v1/usage-agreement?from=${encodeURIComponent(from.toISOString())}`, { token })),
    [range, token],
  );
  const rows = usage.data?.data ?? [];
  const points = rows.map((r) => ({ key: label(r.key, group), input: r.tokensInput, output: r.tokensOutput, requests: r.requests }));

  return (
    <Space direction="vertical" size="large" style={{ width: "100%" }}>
      <Typography.Title level={3}>Usage</Typography.Title>
      <Space>
        <Segmented options={["hour", "day", "model", "project"]} value={group} onChange={(v) => setGroup(String(v))} data-testid="group" />
        <Segmented options={Object.keys(RANGES)} value={range} onChange={(v) => setRange(String(v))} />
      </Space>
      {usage.error && <Alert type="error" showIcon message={usage.error} />}
      <Card title="Tokens and requests">
        {rows.length === 0 && !usage.loading ? (
          <Typography.Text type="secondary">No usage in this window.</Typography.Text>
        ) : (
          <Suspense fallback={<Spin />}>
            <UsageCharts points={points} />
          </Suspense>
        )}
      </Card>
      <Card title="Totals">
        <Table data-testid="usage" rowKey="key" size="small" dataSource={rows} loading={usage.loading && !usage.data}
          columns={[
            { title: group, dataIndex: "key", render: (k: string) => label(k, group) },
            { title: "Requests", dataIndex: "requests" },
            { title: "Input", dataIndex: "tokensInput" },
            { title: "of which cached", dataIndex: "tokensCached" },
            { title: "Output", dataIndex: "tokensOutput" },
            { title: "Units (µ)", dataIndex: "units" },
          ]} />
      </Card>
      {who.role !== "tenant" && (
        <Card title="Usage agreement: the engine's counts against the gateway's">
          {agreement.error && <Alert type="error" showIcon message={agreement.error} />}
          <Table data-testid="agreement" rowKey="model" size="small" dataSource={agreement.data?.data ?? []}
            columns={[
              { title: "Model", dataIndex: "model" },
              { title: "Requests", dataIndex: "requests" },
              { title: "Compared", dataIndex: "compared" },
              { title: "Without engine usage", dataIndex: "withoutEngineUsage" },
              { title: "Out of bounds (billed at the bound)", dataIndex: "outOfBounds" },
              { title: "Prompt: mean difference", render: (_, a) => (a.prompt.meanRelativeDiff === null ? "–" : percent(a.prompt.meanRelativeDiff)) },
              { title: "Prompt: p95 |difference|", render: (_, a) => (a.prompt.p95AbsRelativeDiff === null ? "–" : percent(a.prompt.p95AbsRelativeDiff)) },
              { title: "Completion: mean difference", render: (_, a) => (a.completion.meanRelativeDiff === null ? "–" : percent(a.completion.meanRelativeDiff)) },
              { title: "Gateway count methods", render: (_, a) => a.countMethods.join(", ") },
            ]} />
        </Card>
      )}
    </Space>
  );
}
