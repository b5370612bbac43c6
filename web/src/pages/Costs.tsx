import { useState } from "react";
import { Alert, App, Button, Card, Descriptions, Form, Input, Space, Table, Tag, Typography } from "antd";
import { api, ApiError, raw } from "../lib/api";
import { canWrite } from "../lib/access";
import { gpuHours, money, percent, previousMonth, toMicro } from "../lib/format";
import { Pager, usePaged } from "../lib/usePaged";
import { useSession } from "../session";

interface Rate {
  id: string;
  cluster: string;
  gpuHourMicro: number;
  currency: string;
  effectiveFrom: string | null;
}
interface Summary {
  period: string;
  currency: string | null;
  pool: number;
  busy: number;
  idle: number;
  coverage: number;
  forced: boolean;
  closedAt: string;
  recomputes: number;
}
interface Report {
  period: string;
  currency: string | null;
  pool: number;
  busy: number;
  idle: number;
  allocated: number;
  unallocated: number;
  coverage: number;
  minCoverage: number;
  forced: boolean;
  unplacedRequests: number;
  clusters: { cluster: string; coverage: number; pool: number; busyGpuMicroseconds: number; observedGpuMicroseconds: number }[];
  tenants: { tenant: string; usedGpuMicroseconds: number; allocated: number; corrections: number; due: number }[];
  allocations: { tenant: string; project: string; usedGpuMicroseconds: number; allocated: number }[];
  corrections: { fromPeriod: string; tenant: string; project: string; amount: number }[];
  closedAt?: string | null;
}

function ReportView({ report }: { report: Report }) {
  const { token } = useSession();
  const { message } = App.useApp();
  const c = report.currency;
  async function downloadCsv() {
    const response = await raw(`/api/v1/cost-periods/${report.period}?format=csv`, { token, accept: "text/csv" }).catch((e: Error) => {
      void message.error(e.message);
      throw e;
    });
    const url = URL.createObjectURL(await response.blob());
    const link = document.createElement("a");
    link.href = url;
    link.download = `fleet-costs-${report.period}.csv`;
    link.click();
    setTimeout(() => URL.revokeObjectURL(url), 1000);
  }
  return (
    <Card
      data-testid="report"
      title={`Report ${report.period}`}
      extra={<Button onClick={() => void downloadCsv()} data-testid="csv">Download CSV</Button>}
    >
      <Descriptions size="small" column={4} bordered>
        <Descriptions.Item label="Pool">{money(report.pool, c)}</Descriptions.Item>
        <Descriptions.Item label="Busy">{money(report.busy, c)}</Descriptions.Item>
        <Descriptions.Item label="Idle">{money(report.idle, c)}</Descriptions.Item>
        <Descriptions.Item label="Allocated">{money(report.allocated, c)}</Descriptions.Item>
        <Descriptions.Item label="Unallocated">{money(report.unallocated, c)}</Descriptions.Item>
        <Descriptions.Item label="Coverage">
          {percent(report.coverage)} (minimum {percent(report.minCoverage)}) {report.forced && <Tag color="orange">forced</Tag>}
        </Descriptions.Item>
        <Descriptions.Item label="Unplaced requests">{report.unplacedRequests}</Descriptions.Item>
        <Descriptions.Item label="Closed">{report.closedAt ? new Date(report.closedAt).toLocaleString() : "–"}</Descriptions.Item>
      </Descriptions>
      <Typography.Title level={5} style={{ marginTop: 16 }}>Allocations</Typography.Title>
      <Table size="small" rowKey={(a) => `${a.tenant}/${a.project}`} dataSource={report.allocations} pagination={false}
        columns={[
          { title: "Tenant", dataIndex: "tenant" },
          { title: "Project", dataIndex: "project" },
          { title: "GPU time used", dataIndex: "usedGpuMicroseconds", render: (n: number) => gpuHours(n) },
          { title: "Allocated", dataIndex: "allocated", render: (n: number) => money(n, c) },
        ]} />
      <Typography.Title level={5} style={{ marginTop: 16 }}>Tenants</Typography.Title>
      <Table size="small" rowKey="tenant" dataSource={report.tenants} pagination={false}
        columns={[
          { title: "Tenant", dataIndex: "tenant" },
          { title: "Allocated", dataIndex: "allocated", render: (n: number) => money(n, c) },
          { title: "Corrections", dataIndex: "corrections", render: (n: number) => money(n, c) },
          { title: "Due", dataIndex: "due", render: (n: number) => money(n, c) },
        ]} />
      <Typography.Title level={5} style={{ marginTop: 16 }}>Clusters</Typography.Title>
      <Table size="small" rowKey="cluster" dataSource={report.clusters} pagination={false}
        columns={[
          { title: "Cluster", dataIndex: "cluster" },
          { title: "Coverage", dataIndex: "coverage", render: (n: number) => percent(n) },
          { title: "Observed", dataIndex: "observedGpuMicroseconds", render: (n: number) => gpuHours(n) },
          { title: "Busy", dataIndex: "busyGpuMicroseconds", render: (n: number) => gpuHours(n) },
          { title: "Pool", dataIndex: "pool", render: (n: number) => money(n, c) },
        ]} />
      {report.corrections.length > 0 && (
        <>
          <Typography.Title level={5} style={{ marginTop: 16 }}>Corrections</Typography.Title>
          <Table size="small" rowKey={(r) => `${r.fromPeriod}/${r.tenant}/${r.project}`} dataSource={report.corrections} pagination={false}
            columns={[
              { title: "From", dataIndex: "fromPeriod" },
              { title: "Tenant", dataIndex: "tenant" },
              { title: "Project", dataIndex: "project" },
              { title: "Amount", dataIndex: "amount", render: (n: number) => money(n, c) },
            ]} />
        </>
      )}
    </Card>
  );
}

export default function Costs() {
  const { token, who } = useSession();
  const { message, modal } = App.useApp();
  const writer = canWrite(who, "costs");
  const rates = usePaged<Rate>("/api/v1/cost-rates", token);
  const periods = usePaged<Summary>("/api/v1/cost-periods", token);
  const [month, setMonth] = useState(previousMonth(new Date()));
  const [report, setReport] = useState<Report>();
  const [refusal, setRefusal] = useState<ApiError>();

  async function close(force: boolean) {
    setRefusal(undefined);
    try {
      const query = force ? "?minCoverage=0" : "";
      setReport(await api<Report>(`/api/v1/cost-periods/${month}${query}`, { method: "PUT", token }));
      periods.reload();
      message.success(`${month} closed`);
    } catch (e) {
      if (e instanceof ApiError) setRefusal(e);
      else message.error(String(e));
    }
  }

  function confirmForce() {
    modal.confirm({
      title: `Force-close ${month} below the coverage minimum?`,
      content: "The report will be marked forced: capacity the inventory did not report is not in the pool.",
      okText: "Force close",
      okButtonProps: { danger: true },
      onOk: () => close(true),
    });
  }

  async function open(period: string) {
    try {
      setReport(await api<Report>(`/api/v1/cost-periods/${period}`, { token }));
    } catch (e) {
      message.error(e instanceof Error ? e.message : String(e));
    }
  }

  return (
    <Space direction="vertical" size="large" style={{ width: "100%" }}>
      <Typography.Title level={3}>Costs</Typography.Title>
      <Card title="Cost rates (per GPU-hour, per cluster)">
        {writer && (
          <Form layout="inline" style={{ marginBottom: 16 }}
            onFinish={async ({ cluster, amount, currency }) => {
              const micro = toMicro(String(amount));
              if (micro === null) return message.error("amount: a number with up to 6 decimals");
              try {
                await api("/api/v1/cost-rates", { method: "POST", token, body: { cluster, gpuHourMicro: micro, currency } });
                rates.reload();
              } catch (e) {
                message.error(e instanceof Error ? e.message : String(e));
              }
            }}>
            <Form.Item name="cluster" rules={[{ required: true }]}><Input placeholder="cluster" /></Form.Item>
            <Form.Item name="amount" rules={[{ required: true }]}><Input placeholder="per GPU-hour, e.g. 2.50" /></Form.Item>
            <Form.Item name="currency" initialValue="USD" rules={[{ required: true }]}><Input style={{ width: 80 }} /></Form.Item>
            <Button htmlType="submit">Add rate</Button>
          </Form>
        )}
        <Table data-testid="rates" rowKey="id" size="small" dataSource={rates.rows} pagination={false}
          columns={[
            { title: "Cluster", dataIndex: "cluster" },
            { title: "Per GPU-hour", render: (_, r) => money(r.gpuHourMicro, r.currency) },
            { title: "From", dataIndex: "effectiveFrom", render: (t: string | null) => (t ? new Date(t).toLocaleString() : "always") },
          ]} />
        <Pager list={rates} testId="rates-pager" />
      </Card>
      <Card title="Close a month">
        <Space>
          <Input value={month} onChange={(e) => setMonth(e.target.value)} style={{ width: 120 }} data-testid="month" />
          {writer && <Button type="primary" onClick={() => void close(false)} data-testid="close">Close month</Button>}
        </Space>
        {refusal && (
          <Alert style={{ marginTop: 12 }} type="warning" showIcon data-testid="refusal"
            message={`Not closed: ${refusal.message}`}
            action={refusal.code === "insufficient_coverage" && writer ? <Button danger size="small" onClick={confirmForce} data-testid="force">Force close…</Button> : undefined} />
        )}
      </Card>
      <Card title="Closed months">
        {periods.error && <Alert type="error" showIcon message={periods.error} />}
        <Table data-testid="periods" rowKey="period" size="small" dataSource={periods.rows} pagination={false}
          columns={[
            { title: "Month", dataIndex: "period", render: (p: string) => <a onClick={() => void open(p)}>{p}</a> },
            { title: "Pool", render: (_, s) => money(s.pool, s.currency) },
            { title: "Busy", render: (_, s) => money(s.busy, s.currency) },
            { title: "Idle", render: (_, s) => money(s.idle, s.currency) },
            { title: "Coverage", render: (_, s) => <>{percent(s.coverage)} {s.forced && <Tag color="orange">forced</Tag>}</> },
            { title: "Closed", dataIndex: "closedAt", render: (t: string) => new Date(t).toLocaleString() },
          ]} />
        <Pager list={periods} testId="periods-pager" />
      </Card>
      {report && <ReportView report={report} />}
    </Space>
  );
}
